-- Idempotency keys of probe runs and observations (advisor/idempotency.py): a request sent again under the key
-- of one already stored stores nothing and gets that one's answer. One row per (writing site, kind, key),
-- written in the transaction that stores the record; pruned by advisor/retention.py after a month.
CREATE TABLE request_keys (
    src TEXT NOT NULL,
    kind TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    request_digest TEXT NOT NULL,
    answer TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (src, kind, idempotency_key)
);
CREATE INDEX request_keys_created ON request_keys (created_at);
