"""Links (a site's destinations, rows of ``destinations``) and the congestion controls each holds results under:
made on first write, counted against a site's cap, and their controls against a link's.

:class:`Links` holds the checks; :class:`advisor.store.Store`, the one object callers use, inherits them.
"""

from __future__ import annotations

from typing import Callable, Iterable, TypeVar

from advisor.db import Database, Tx
from advisor.destinations import Destination
from advisor.errors import TooManyControls, TooManyLinks, TooManySites
from advisor.limits import MAX_LINK_CONTROLS, MAX_SITE_LINKS, MAX_SITES
from advisor.locks import LINK_COUNT_LOCK, SITE_COUNT_LOCK

# A site the store knows (parameters: its name three times): registered, or with a link or a queued or running probe.
_KNOWN_SITE = ("SELECT 1 FROM sites WHERE name = ? UNION ALL SELECT 1 FROM destinations WHERE src = ? UNION ALL "
               "SELECT 1 FROM probe_jobs WHERE src = ? AND status IN ('queued', 'running')")
# The sources of links, each once, in as many index look-ups as there are (a loose index scan on (src, dest)), not a
# read of every link.
_LINK_SOURCES = ("WITH RECURSIVE s(src) AS (SELECT min(src) FROM destinations UNION ALL "
                 "SELECT (SELECT min(d.src) FROM destinations d WHERE d.src > s.src) FROM s WHERE s.src IS NOT NULL) "
                 "SELECT src FROM s WHERE src IS NOT NULL")
# The key of Tx.memo holding the link counts check_new_link keeps for the transaction.
_LINK_COUNTS = "site_link_counts"


T = TypeVar("T")


def advised(held: Iterable[tuple[str | None, float, T]], control: str, default_control: str | None) -> T | None:
    """Of a link's current fits (or newest runs), one per control, each (its control, when its probes ended in Unix
    seconds, it), the one the advice under ``control`` rests on, or None: the one under ``control``; for
    ``default_control`` (the service's; None: not known), the one on the newer probes of that and the one that
    recorded no control (stored before controls were, or pushed without one), the recorded one among equals.

    The one rule for every reader (the API, advisor.schedule.SqlAdvice, site agents' freshness, observations'
    refits); docs/advice-service.md gives it to schedulers in SQL."""
    unrecorded = control == default_control
    best: tuple[tuple[float, bool], T] | None = None
    for held_control, probed_at, item in held:
        if held_control == control or (unrecorded and held_control is None):
            key = (probed_at, held_control is not None)
            if best is None or key > best[0]:
                best = key, item
    return None if best is None else best[1]


def same_control(column: str, control: str | None) -> tuple[str, tuple]:
    """SQL (and its parameters) for ``column`` holding ``control``; None matches NULL (not recorded)."""
    if control is None:
        return f"{column} IS NULL", ()
    return f"{column} = ?", (control,)


class Links:
    """A site's links and their controls, a part of :class:`advisor.store.Store` (which gives it ``db`` and
    ``clock``)."""

    db: Database
    clock: Callable[[], float]
    # The most sites the store holds, and the sites never refused nor counted (the service's own, and those its
    # operator gave tokens): set by limit_sites.
    max_sites: int = MAX_SITES
    exempt_sites: frozenset[str] = frozenset()

    def limit_sites(self, max_sites: int, exempt: Iterable[str]) -> None:
        """Hold the store to ``max_sites`` sites besides those ``exempt`` (TAME_MAX_SITES; TAME_SITE and the sites of
        TAME_SITE_TOKENS, which the operator named, so that clients naming other sites cannot lock them out)."""
        self.max_sites = max_sites
        self.exempt_sites = frozenset(exempt)

    def check_new_site(self, tx: Tx, src: str) -> None:
        """Refuse (TooManySites, nothing written) to make ``src`` a site when the store knows no such site yet
        (registered, or with a link or a queued or running probe) and holds max_sites others; the exempt sites
        (limit_sites) are never refused nor counted. Sites are few (this cap bounds them), so counting them reads that few names."""
        if src in self.exempt_sites or tx.execute(_KNOWN_SITE, (src, src, src)).fetchone() is not None:
            return
        if self.db.dialect == "postgresql":
            # The site's own link-count lock first, as check_new_link takes it, then the count's: one order.
            tx.execute(f"SELECT pg_advisory_xact_lock({LINK_COUNT_LOCK}, hashtext(?))", (src,))
            tx.execute(f"SELECT pg_advisory_xact_lock({SITE_COUNT_LOCK})")
        names = {r[0] for r in tx.execute("SELECT name FROM sites").fetchall()}
        names.update(r[0] for r in tx.execute(_LINK_SOURCES).fetchall())
        names.update(r[0] for r in tx.execute(
            "SELECT DISTINCT src FROM probe_jobs WHERE status IN ('queued', 'running')").fetchall())
        names -= self.exempt_sites
        if src not in names and len(names) >= self.max_sites:
            raise TooManySites(
                f"this service keeps {len(names)} sites, the most it keeps (TAME_MAX_SITES={self.max_sites}), and "
                f"{src} would be another, so nothing was stored. Write for a site it has, or wait: a site with no "
                "link, no queued or running probe and no registration newer than TAME_RUN_MAX_AGE_S is removed "
                "when the store is pruned (never while TAME_RUN_MAX_AGE_S is 0). The operator can raise "
                "TAME_MAX_SITES, or set TAME_TOKEN so that only its token holders write")

    def link_id(self, tx: Tx, src: str, dest: Destination, max_links: int = MAX_SITE_LINKS) -> int:
        """The row id of the link from site ``src`` to ``dest`` (a row of ``destinations``), the row created if
        missing; safe against concurrent first writes. A new link is refused (TooManyLinks, nothing written) when
        ``src`` has ``max_links`` links already (:meth:`check_new_link`)."""
        # On PostgreSQL the row is held (KEY SHARE, as a foreign key's check holds it) until the transaction ends,
        # so pruning (advisor/retention.py) cannot remove a link a write has just found; one being removed is
        # waited for and then not found, and made again.
        held = " FOR KEY SHARE" if self.db.dialect == "postgresql" else ""
        select = f"SELECT id FROM destinations WHERE src = ? AND dest = ?{held}"
        row = tx.execute(select, (src, dest.key)).fetchone()
        if row:  # the common case, without an insert that would spend an id of the sequence
            return row[0]
        self.check_new_link(tx, src, dest.key, max_links)
        # Several transactions may miss the row at once (on PostgreSQL they run in parallel): the
        # upsert makes all but one wait for the winner's commit and do nothing, and the SELECT after
        # it (a new snapshot under READ COMMITTED) then sees that row.
        made = tx.execute(
            "INSERT INTO destinations (src, dest, host, port, created_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (src, dest) DO NOTHING RETURNING id",
            (src, dest.key, dest.host, dest.port, self.clock()),
        ).fetchone()
        if made:
            return made[0]
        # Another transaction's row: whether this transaction's count of the site's links saw it is not known, so
        # the next new link counts them again.
        self._forget_link_count(tx, src)
        return tx.execute(select, (src, dest.key)).fetchone()[0]

    def _link_controls(self, tx: Tx, src: str, dest_key: str) -> list[str]:
        """The controls link (``src``, ``dest_key``) holds results under, and those of its queued and running probes
        (a probe queued under a new control holds its place, so its run is never refused after it ran)."""
        return sorted(r[0] for r in tx.execute(
            "SELECT lc.congestion_control FROM link_controls lc JOIN destinations d ON d.id = lc.destination_id "
            "WHERE d.src = ? AND d.dest = ? UNION SELECT congestion_control FROM probe_jobs WHERE src = ? AND dest = ? "
            "AND status IN ('queued', 'running') AND congestion_control IS NOT NULL",
            (src, dest_key, src, dest_key)).fetchall())

    def check_link_control(self, tx: Tx, destination_id: int, control: str | None, src: str, dest_key: str) -> None:
        """Record that link ``destination_id`` (``src`` to ``dest_key``) holds results under ``control`` (None: not
        recorded, no check); TooManyControls, and nothing of this transaction kept, when that would make more than
        MAX_LINK_CONTROLS, counting its queued and running probes' controls (:meth:`check_job_control`)."""
        held_already = "SELECT 1 FROM link_controls WHERE destination_id = ? AND congestion_control = ?"
        if control is None or tx.execute(held_already, (destination_id, control)).fetchone() is not None:
            return
        self.check_job_control(tx, src, dest_key, control)
        tx.execute("INSERT INTO link_controls (destination_id, congestion_control) VALUES (?, ?) "
                   "ON CONFLICT (destination_id, congestion_control) DO NOTHING", (destination_id, control))

    def check_job_control(self, tx: Tx, src: str, dest_key: str, control: str | None) -> None:
        """TooManyControls when results or a probe of link (``src``, ``dest_key``) under ``control`` would be one
        control more than MAX_LINK_CONTROLS (a probe's run would be refused after it ran)."""
        if control is None:
            return
        if self.db.dialect == "postgresql":
            # One new control of a link at a time, so two at once cannot both find room for one; taken before
            # link_controls' INSERT, whose key check would share the row with the other one's (a deadlock). Writes
            # under the link's own controls (a key share) are not held back by it.
            tx.execute("SELECT 1 FROM destinations WHERE src = ? AND dest = ? FOR NO KEY UPDATE", (src, dest_key))
        held = self._link_controls(tx, src, dest_key)
        if control not in held and len(held) >= MAX_LINK_CONTROLS:
            raise TooManyControls(
                f"link {src} -> {dest_key} holds results or probes under {len(held)} congestion controls "
                f"({', '.join(held):.300}), the most this service keeps for one link, and {control!r} would be "
                "another, so nothing was stored: report it under the control the streams used, one of those (a "
                "control is released once nothing under it is newer than TAME_RUN_MAX_AGE_S and no probe under it is "
                "queued or running; never while TAME_RUN_MAX_AGE_S is 0)")

    def check_new_link(self, tx: Tx, src: str, dest_key: str, max_links: int) -> None:
        """Refuse (TooManyLinks) to make ``dest_key`` a link of ``src`` when it is not one yet and ``src`` has
        ``max_links`` links: rows of ``destinations`` and destinations of its queued or running probe jobs (a probe
        queued for a new link holds its place, so its run is never refused after it ran). Each new link would
        bring its own retention allowance (advisor/retention.py), so links are what bounds the store per site.

        A link this passes is taken as made by the caller in this transaction (or the transaction ends): the site's
        links are counted once per transaction, and each new link passed adds one, so a registration of many new
        links reads them once, not once per link."""
        counts = tx.memo.setdefault(_LINK_COUNTS, {})  # src: its links in this transaction, or None: not counted
        if src not in counts:
            if self.db.dialect == "postgresql":
                # Held to the end of the transaction, so no other transaction adds one of the site's links while
                # this one's count stands; SQLite's write transactions are serial already.
                tx.execute(f"SELECT pg_advisory_xact_lock({LINK_COUNT_LOCK}, hashtext(?))", (src,))
            counts[src] = None
        known = tx.execute(
            "SELECT 1 FROM destinations WHERE src = ? AND dest = ? UNION ALL SELECT 1 FROM probe_jobs WHERE src = ? "
            "AND dest = ? AND status IN ('queued', 'running')", (src, dest_key, src, dest_key)).fetchone()
        if known:
            return
        links = counts[src]
        if links is None:
            links = counts[src] = tx.execute(
                "SELECT count(*) FROM (SELECT dest FROM destinations WHERE src = ? UNION SELECT dest FROM probe_jobs "
                "WHERE src = ? AND status IN ('queued', 'running')) AS links", (src, src)).fetchone()[0]
        if links == 0:
            self.check_new_site(tx, src)
        if links >= max_links:
            raise TooManyLinks(
                f"site {src} has {links} links, the most this service keeps for one site (TAME_MAX_SITE_LINKS="
                f"{max_links}), and {dest_key} would be another, so it was not stored. Write for a link it has, or "
                "wait: a link with no queued or running probe and nothing newer than TAME_RUN_MAX_AGE_S "
                "(fits, runs, observations, probes) is removed when the store is pruned (never while TAME_RUN_MAX_AGE_S "
                "is 0). The operator can raise TAME_MAX_SITE_LINKS")
        counts[src] = links + 1

    @staticmethod
    def _forget_link_count(tx: Tx, src: str) -> None:
        counts = tx.memo.get(_LINK_COUNTS)
        if counts is not None and src in counts:
            counts[src] = None  # counted again when next needed; the site's lock is still held
