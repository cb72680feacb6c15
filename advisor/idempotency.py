"""Writes a client may send again: a probe run or observation named by an ``Idempotency-Key`` is stored once.

An agent whose POST committed but whose answer was lost (a timeout, a restart of either side) sends the run again
from its spool; with the key it sent the first time, the second request stores nothing and gets the first one's
answer (IETF draft-ietf-httpapi-idempotency-key-header). The key is claimed in the write's own transaction, so the
run and its key commit together or not at all, and two requests with one key at once store one run: the second
waits for the first's commit and then answers from it. A key is scoped by the writing site and the kind of write;
sent again with another body (``measured_ago_s`` aside: a re-sent run's age grows), it is refused. A key lives as
long as the record it names: advisor/retention.py removes it when it prunes that run or observation, so keys are
bounded as the records are; a request sent again after that is stored again.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from advisor.db import Tx
from advisor.errors import InvalidRequest, StoreError

MAX_KEY_LENGTH = 128
_KEY = re.compile(r"[A-Za-z0-9._:~+/=-]+")
PROBE_RUN = "probe-run"
OBSERVATION = "observation"


class KeyReused(InvalidRequest):
    """An Idempotency-Key was sent again with another request body."""


class AlreadyTaken(Exception):
    """The request's key was stored by an earlier request: ``answer`` is what that one was answered."""

    def __init__(self, kind: str, answer: dict[str, Any]):
        super().__init__(f"{kind} already stored under this key")
        self.kind = kind
        self.answer = answer


def check_key(key: str) -> str:
    """An Idempotency-Key as sent (one pair of surrounding quotes allowed, as a structured-field string), bare;
    InvalidRequest for a key that is empty, too long or not URL-safe (it could not go in a header either)."""
    bare = key[1:-1] if len(key) >= 2 and key[0] == key[-1] == '"' else key
    if not 1 <= len(bare) <= MAX_KEY_LENGTH or not _KEY.fullmatch(bare):
        raise InvalidRequest(f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} characters of letters, digits and "
                             "._:~+/=- (a UUID, say), the same each time one request is sent again")
    return bare


@dataclass(frozen=True)
class KeyedRequest:
    """A write from site ``src`` of ``kind`` (:data:`PROBE_RUN`, :data:`OBSERVATION`) named by the client's ``key``;
    ``digest``: the SHA-256 of its body's fields."""

    src: str
    kind: str
    key: str
    digest: str

    @classmethod
    def checked(cls, src: str, kind: str, key: str, fields: dict[str, Any]) -> "KeyedRequest":
        """From a header's value (one pair of surrounding quotes allowed, as a structured-field string) and the
        request's fields (JSON values, those left at their defaults left out, so that a field written out at its
        default, or added later with a default, is the same request); InvalidRequest for a key that is empty, too
        long or not URL-safe."""
        bare = check_key(key)
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return cls(src, kind, bare, hashlib.sha256(canonical.encode()).hexdigest())

    def claim(self, tx: Tx, now: float) -> None:
        """Claim the key in ``tx``: returns when it is new (call :meth:`remember` before the commit), raises
        AlreadyTaken with the first answer when a committed request holds it, KeyReused when that one's body differed."""
        # ON CONFLICT makes a second claim wait for a first one still open and then find its row (PostgreSQL under
        # READ COMMITTED: the SELECT's new snapshot sees it); on SQLite write transactions run one at a time.
        made = tx.execute(
            "INSERT INTO request_keys (src, kind, idempotency_key, request_digest, created_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (src, kind, idempotency_key) DO NOTHING RETURNING created_at",
            (self.src, self.kind, self.key, self.digest, now),
        ).fetchone()
        if made:
            return
        row = tx.execute("SELECT request_digest, answer FROM request_keys WHERE src = ? AND kind = ? "
                         "AND idempotency_key = ?", (self.src, self.kind, self.key)).fetchone()
        if row is None or row[1] is None:  # pruned, or rolled back, between the two statements: a rare race
            raise StoreError(f"the {self.kind} under Idempotency-Key {self.key!r} of {self.src} went between two "
                             "statements (pruned or rolled back); the client sends it again")
        if row[0] != self.digest:
            raise KeyReused(f"this Idempotency-Key was sent with another {self.kind} from {self.src}: give each "
                            "request its own key, and send a request again only with the body it had")
        raise AlreadyTaken(self.kind, json.loads(row[1]))

    def remember(self, tx: Tx, record_id: int, answer: dict[str, Any]) -> None:
        """Keep the stored record's id and ``answer`` (JSON values), what the key's request was answered; in the
        transaction that claimed it."""
        tx.execute("UPDATE request_keys SET record_id = ?, answer = ? WHERE src = ? AND kind = ? AND idempotency_key = ?",
                   (record_id, json.dumps(answer, allow_nan=False), self.src, self.kind, self.key))


# The table each kind's record_id names a row of.
RECORD_TABLES = {PROBE_RUN: "probe_runs", OBSERVATION: "observations"}
