"""The host names whose lookup timed out when a site registered them, kept per site, so that the site's next
registration checks them after its other names and goes round them, oldest timeout first."""

from __future__ import annotations

import threading
from collections import OrderedDict


class SlowNames:
    """Per site, the host names whose lookup last timed out in its registrations, the oldest timeout first; at most
    ``kept`` names in all. When a timeout would make one more, the site holding the most names forgets its oldest,
    so one site registering thousands of slow names cannot make another forget its own; on a tie, a site other than
    the one registering (the one held longest), so a timeout just learnt is never the name forgotten. A site with no
    name left is dropped, so at most ``kept`` sites are held. Safe to use from many threads."""

    def __init__(self, kept: int):
        if kept < 1:
            raise ValueError(f"kept must be at least 1, got {kept!r}")
        self.kept = kept
        self._sites: dict[str, OrderedDict[str, None]] = {}
        self._count = 0
        self._lock = threading.Lock()

    def ages(self, site: str) -> dict[str, int]:
        """``site``'s remembered names, each with its rank: 0 for the one whose timeout was longest ago."""
        with self._lock:
            return {host: rank for rank, host in enumerate(self._sites.get(site, ()))}

    def timed_out(self, site: str, host: str) -> None:
        """``host``'s lookup timed out now in ``site``'s registration: remembered as its newest timeout."""
        with self._lock:
            names = self._sites.setdefault(site, OrderedDict())
            if host in names:
                names.move_to_end(host)
                return
            names[host] = None
            self._count += 1
            while self._count > self.kept:
                fullest = max(self._sites, key=lambda s: (len(self._sites[s]), s != site))
                self._forget(fullest, next(iter(self._sites[fullest])))

    def looked_up(self, site: str, host: str) -> None:
        """``host`` was looked up in ``site``'s registration and did not time out (it resolved, or it does not
        exist): no longer slow for that site."""
        with self._lock:
            if host in self._sites.get(site, ()):
                self._forget(site, host)

    def _forget(self, site: str, host: str) -> None:
        names = self._sites[site]
        del names[host]
        self._count -= 1
        if not names:
            del self._sites[site]

    def __len__(self) -> int:
        """How many names are remembered, every site's."""
        return self._count

    def sites(self) -> int:
        """How many sites have names remembered."""
        return len(self._sites)
