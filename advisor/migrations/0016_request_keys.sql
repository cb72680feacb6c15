-- Idempotency keys of probe runs and observations (advisor/idempotency.py): a request sent again under the key
-- of one already stored stores nothing and gets that one's answer. One row per (writing site, kind, key),
-- written in the transaction that stores the record it names (record_id: the probe run's or observation's id);
-- advisor/retention.py removes it once that record is pruned.
CREATE TABLE request_keys (
    id {{ID}},
    src TEXT NOT NULL,
    kind TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    request_digest TEXT NOT NULL,
    record_id BIGINT,
    answer TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    UNIQUE (src, kind, idempotency_key)
);
