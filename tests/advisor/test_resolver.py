"""Name lookups have a deadline (advisor.allowlist.system_resolver): a name under a zone whose servers never answer
held a request's thread for as long as the C library retried (timeout x attempts), and 40 such requests every thread
of the server. Real getaddrinfo, against a DNS server on loopback that never answers, in a mount namespace of the
test's own whose /etc/resolv.conf names it."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.netns

LOOKUPS = textwrap.dedent("""
    import json, socket, sys, threading, time
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.77", 53))  # takes every query, answers none
    threading.Thread(target=lambda: [silent.recvfrom(4096) for _ in iter(int, 1)], daemon=True).start()
    import advisor.allowlist as allowlist
    from advisor.errors import AdvisorError
    allowlist.RESOLVE_TIMEOUT_S = 1.0
    out = []

    def resolve(name):
        began = time.monotonic()
        try:
            allowlist.system_resolver(name)
            out.append(("resolved", name, time.monotonic() - began, None))
        except AdvisorError as exc:  # with the seconds a 503 tells the client to wait (Retry-After)
            out.append((str(exc), name, time.monotonic() - began, getattr(exc, "retry_after_s", None)))

    threads = [threading.Thread(target=resolve, args=(f"slow{i}.tame.invalid",)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    resolve("localhost")  # /etc/hosts, no DNS: but the 8 slots are still held by lookups glibc retries for 15 s
    print(json.dumps(out))
""")


def test_a_lookup_that_never_answers_is_refused_within_its_deadline_and_never_holds_the_process(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("a mount namespace with its own resolv.conf needs root") if os.environ.get("CI") else \
            pytest.skip("a mount namespace with its own resolv.conf needs root")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.77\noptions timeout:5 attempts:3\n")  # glibc would retry for 15 s
    began = time.monotonic()
    done = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"',
                           "sh", str(resolv), sys.executable, "-c", LOOKUPS], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    import json

    results = json.loads(done.stdout)
    slow = [r for r in results if r[1] != "localhost"]
    # Each of the twelve refused at its deadline (1 s): 8 looked up and timed out, and the 4 that waited for one of
    # the 8 slots in vain refused saying they were never looked up.
    assert len(slow) == 12 and all(took_s < 2.5 for _, _, took_s, _ in slow), slow
    assert sorted("did not resolve within 1 s" in why for why, _, _, _ in slow) == [False] * 4 + [True] * 8, slow
    assert all("was not looked up: this service's 8 name lookups were all busy for 1 s" in why
               for why, _, _, _ in slow if "did not resolve" not in why), slow
    # Either way nothing is known against the name: to be asked again after the deadline (503, Retry-After), where
    # a timed-out one was a 422 that tame agent took for the request's own fault.
    assert {retry_after_s for _, _, _, retry_after_s in slow} == {1.0}, slow
    # The process ends at once: the hanging lookups are not waited for (glibc alone would take 15 s).
    assert took < 8, took
    # At most 8 lookups at once: with 8 still hanging, a ninth waits for a slot no longer than its deadline, and is
    # refused saying it was never looked up (not that it "did not resolve within 1 s").
    [(why, _, took_s, _)] = [r for r in results if r[1] == "localhost"]
    assert why == ("dest host 'localhost' was not looked up: this service's 8 name lookups were all busy for 1 s: "
                   "try again later, or give its address")
    assert took_s < 2.5


DELAYED = textwrap.dedent("""
    import json, socket, struct, threading, time
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.77", 53))

    def answer_late():  # a query for an A record answered 127.0.0.9 after 0.5 s; others (AAAA) at once, no record
        while True:
            query, client = server.recvfrom(4096)
            qtype = struct.unpack("!H", query[-4:-2])[0]
            if qtype == 1:
                time.sleep(0.5)
            header = query[:2] + struct.pack("!HHHHH", 0x8180, 1, 1 if qtype == 1 else 0, 0, 0)
            record = struct.pack("!HHHLH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton("127.0.0.9") if qtype == 1 else b""
            server.sendto(header + query[12:] + record, client)

    threading.Thread(target=answer_late, daemon=True).start()
    import advisor.allowlist as allowlist
    from advisor.errors import AdvisorError
    allowlist.RESOLVE_TIMEOUT_S = 1.0
    for _ in range(allowlist.LOOKUP_SLOTS):  # every slot busy until 0.8 s from now
        allowlist._lookup_slots.acquire()
    threading.Timer(0.8, lambda: [allowlist._lookup_slots.release() for _ in range(allowlist.LOOKUP_SLOTS)]).start()
    began = time.monotonic()
    try:
        out = [allowlist.system_resolver("late.tame.test"), None]
    except AdvisorError as exc:
        out = [None, str(exc)]
    print(json.dumps(out + [time.monotonic() - began]))
""")


def test_a_name_that_waited_for_a_lookup_slot_still_has_its_whole_time_to_resolve(tmp_path):
    # Slots busy for 0.8 s of a 1 s deadline, then a DNS answer in 0.5 s: the lookup had 0.2 s left, and the name
    # was refused as "did not resolve within 1 s" (and remembered as slow) though it resolves in half that.
    if os.geteuid() != 0:
        pytest.fail("a mount namespace with its own resolv.conf needs root") if os.environ.get("CI") else \
            pytest.skip("a mount namespace with its own resolv.conf needs root")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.77\noptions timeout:3 attempts:1\n")
    done = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"',
                           "sh", str(resolv), sys.executable, "-c", DELAYED], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    import json

    addresses, refused, took_s = json.loads(done.stdout)
    assert refused is None and addresses == ["127.0.0.9"], refused
    assert 1.2 < took_s < 2.0, took_s  # 0.8 s for a slot, then the answer


class LookupClock:
    """The service's monotonic clock for a registration's lookups: each lookup a test's resolver makes ``take``s
    its seconds, so no test sleeps."""

    def __init__(self):
        self.now_s = 0.0

    def __call__(self):
        return self.now_s

    def take(self, seconds):
        self.now_s += seconds


class SlowDNS:
    """The service's resolver seam: notes each name looked up (``looked_up``); one of ``slow`` times out, taking
    ``each_s`` of ``clock``; any other resolves to 127.0.0.5 at once."""

    def __init__(self, clock, slow, each_s=0.2):
        self.clock, self.slow, self.each_s = clock, set(slow), each_s
        self.looked_up = []

    def __call__(self, host):
        from advisor.errors import LookupTimedOut

        self.looked_up.append(host)
        if host in self.slow:
            self.clock.take(self.each_s)
            raise LookupTimedOut(f"dest host {host!r} did not resolve within {self.each_s:g} s", retry_after_s=5.0)
        return ["127.0.0.5"]


def _slow_name_service(tmp_path, resolver, clock, allowed="127.0.0.0/8", store_clock=time.time):
    """An AdviceService over a fresh SQLite store (whose Unix time is ``store_clock``) that looks names up with
    ``resolver`` (``allowed``: the allow-list) and reads ``clock`` for a registration's lookup deadline."""
    from advisor.allowlist import AllowList
    from advisor.service import AdviceService
    from advisor.settings import Settings
    from advisor.store import Store

    store = Store.open(f"sqlite:///{tmp_path}/s.sqlite3", clock=store_clock)
    return store, AdviceService(store, Settings(allowed=AllowList.parse(allowed)), resolver=resolver,
                                controls=lambda: ["cubic", "reno", "bbr"], monotonic=clock)


def test_a_registration_stops_resolving_names_when_its_lookup_time_is_spent(tmp_path, monkeypatch):
    # 2,000 names under a slow zone took one request thread 2,000 lookups long. Each lookup here takes 0.2 s (the
    # service's resolver seam; the deadline of each is the test above) and the registration has 0.5 s: the names
    # left are refused saying why, addresses and listed names are still checked, and the rest is registered.
    import advisor.site_desk as site_desk_module
    from advisor.sites import SiteBudget

    monkeypatch.setattr(site_desk_module, "REGISTRATION_LOOKUPS_S", 0.5)
    clock = LookupClock()

    def slow(host):
        clock.take(0.2)
        return ["127.0.0.5"]

    store, service = _slow_name_service(tmp_path, slow, clock, allowed="127.0.0.0/8,listed.example")
    try:
        names = [f"n{i}.example:5201" for i in range(6)]
        got = service.register_site("dtn2", SiteBudget(2, 64, 3600.0),
                                    [*names, "127.0.0.9:5201", "listed.example:5201"])
        refused = {r["dest"]: r["error"] for r in got["refused"]}
        checked = [n for n in names if n not in refused]
        # Looked up at 0, 0.2 and 0.4 s (each within the 0.5 s); at 0.6 s the time is spent.
        assert checked == names[:3], refused
        assert all("name lookups took their 0.5 s (slow DNS)" in refused[n] for n in names[3:])
        assert got["links"] == len(checked) + 2  # the address and the listed name need no lookup
    finally:
        store.close()


def test_names_a_registration_had_no_lookup_time_for_are_checked_first_the_next_time(tmp_path, monkeypatch):
    # Four names whose lookups time out (0.2 s each here) listed before three that resolve at once, 0.5 s for the
    # registration's lookups: the first registration spends it on the slow names and refuses the rest unchecked. The
    # same list again refused the same three, every time; now the slow names go last, so the three are checked.
    import advisor.site_desk as site_desk_module
    from advisor.sites import SiteBudget

    monkeypatch.setattr(site_desk_module, "REGISTRATION_LOOKUPS_S", 0.5)
    clock = LookupClock()
    dns = SlowDNS(clock, [f"slow{i}.example" for i in range(4)])
    slow = [f"slow{i}.example:5201" for i in range(4)]
    fast = [f"fast{i}.example:5201" for i in range(3)]
    store, service = _slow_name_service(tmp_path, dns, clock)
    try:
        first = service.register_site("dtn2", SiteBudget(2, 64, 3600.0), [*slow, *fast])
        refused = {r["dest"]: r["error"] for r in first["refused"]}
        assert first["links"] == 0 and set(refused) == {*slow, *fast}
        assert all("took their 0.5 s (slow DNS)" in refused[d]
                   and "checks these ahead of names whose lookup timed out more recently" in refused[d] for d in fast)
        assert dns.looked_up == ["slow0.example", "slow1.example", "slow2.example"]

        dns.looked_up.clear()
        second = service.register_site("dtn2", SiteBudget(2, 64, 3600.0), [*slow, *fast])
        # The name not reached before and the three fast ones first, then the names that timed out.
        assert dns.looked_up[:4] == ["slow3.example", "fast0.example", "fast1.example", "fast2.example"]
        assert second["links"] == 3
        assert {r["dest"] for r in second["refused"]} == set(slow)
    finally:
        store.close()


def test_one_site_s_slow_names_do_not_evict_another_site_s(tmp_path, monkeypatch):
    # The memory of slow names was one list for every site: a site registering more slow names than it keeps
    # (4,096; 4 here) evicted every other site's, whose next registration checked its slow names first again. Now
    # each site keeps its own, and when the memory is full the site holding the most forgets its oldest.
    import advisor.site_desk as site_desk_module
    from advisor.sites import SiteBudget

    monkeypatch.setattr(site_desk_module, "SLOW_NAMES_KEPT", 4)
    clock = LookupClock()
    theirs = [f"slow{i}.b.example:5201" for i in range(6)]
    dns = SlowDNS(clock, ["slow0.a.example", "slow1.a.example", *(d.rsplit(":", 1)[0] for d in theirs)], each_s=0)
    store, service = _slow_name_service(tmp_path, dns, clock)
    budget = SiteBudget(2, 64, 3600.0)
    mine = ["slow0.a.example:5201", "slow1.a.example:5201", "fast.a.example:5201"]
    try:
        service.register_site("site-a", budget, mine)
        service.register_site("site-b", budget, theirs)
        dns.looked_up.clear()
        service.register_site("site-a", budget, mine)
        # site-a's two slow names are still remembered: its fast name first, then them.
        assert dns.looked_up == ["fast.a.example", "slow0.a.example", "slow1.a.example"]
        dns.looked_up.clear()
        # site-b kept its newest two (4 in all, 2 a site): its other four, not remembered, go first.
        service.register_site("site-b", budget, theirs)
        assert dns.looked_up == [f"slow{i}.b.example" for i in (0, 1, 2, 3, 4, 5)]
    finally:
        store.close()


def test_slow_names_are_checked_oldest_timeout_first_so_registrations_rotate_through_them(tmp_path, monkeypatch):
    # Six names that time out, each taking 0.2 s of the registration's 0.5 s: three are looked up a registration.
    # The remembered ones were checked in the order the site listed them, so the same first three were looked up
    # every time and the other three never again (one whose DNS recovered stayed refused, "not checked").
    # Checked oldest timeout first, successive registrations go round all six.
    import advisor.site_desk as site_desk_module
    from advisor.sites import SiteBudget

    monkeypatch.setattr(site_desk_module, "REGISTRATION_LOOKUPS_S", 0.5)
    clock = LookupClock()
    dns = SlowDNS(clock, [f"slow{i}.example" for i in range(6)])
    store, service = _slow_name_service(tmp_path, dns, clock)
    dests = [f"slow{i}.example:5201" for i in range(6)] + ["fast.example:5201"]

    def register():
        dns.looked_up.clear()
        return service.register_site("dtn2", SiteBudget(2, 64, 3600.0), dests)

    try:
        register()
        assert dns.looked_up == ["slow0.example", "slow1.example", "slow2.example"]
        register()  # the names not reached first (fast.example's turn is not reached: the three before it took it)
        assert dns.looked_up == ["slow3.example", "slow4.example", "slow5.example"]
        register()  # every slow name remembered: fast.example first, then the three that timed out longest ago
        assert dns.looked_up == ["fast.example", "slow0.example", "slow1.example", "slow2.example"]
        dns.slow.discard("slow3.example")  # its DNS recovers
        got = register()
        # slow3.example takes no time now, so a fourth name fits: the oldest timeout of the rest.
        assert dns.looked_up == ["fast.example", "slow3.example", "slow4.example", "slow5.example", "slow0.example"]
        assert got["links"] == 2  # fast.example and slow3.example
    finally:
        store.close()


def test_a_registration_looks_each_host_name_up_once_however_often_and_however_spelt_it_is_listed(tmp_path,
                                                                                                   monkeypatch):
    # A registration looked a host up once per item naming it: a name that times out listed three times (three
    # spellings of one host, or three ports) spent three lookup deadlines of the registration's time (and held three
    # of the process's lookup slots), and the names after it were refused "not checked". Now each host is looked up
    # once a registration, its answer (addresses, or the refusal) used for every item naming it.
    import advisor.site_desk as site_desk_module
    from advisor.sites import SiteBudget

    monkeypatch.setattr(site_desk_module, "REGISTRATION_LOOKUPS_S", 0.5)
    clock = LookupClock()
    dns = SlowDNS(clock, ["slow.example"])
    store, service = _slow_name_service(tmp_path, dns, clock)
    listed = ["slow.example:5201", "SLOW.example", "slow.example.:5202", "fast.example:5201", "Fast.Example.:5202"]
    try:
        got = service.register_site("dtn2", SiteBudget(2, 64, 3600.0), listed)
        assert dns.looked_up == ["slow.example", "fast.example"]
        refused = {r["dest"]: r["error"] for r in got["refused"]}
        assert set(refused) == set(listed[:3]), refused
        assert all("did not resolve within" in why for why in refused.values()), refused
        assert got["links"] == 2  # fast.example's two ports
    finally:
        store.close()


def test_a_name_that_waits_for_a_lookup_slot_in_vain_is_refused_as_not_looked_up(monkeypatch):
    # Every slot taken for the whole deadline: the name was never looked up, but the refusal said it "did not
    # resolve within 5 s" and was a LookupTimedOut, so the service remembered a name it knew nothing of as slow.
    import threading

    import advisor.allowlist as allowlist
    from advisor.errors import AdvisorError

    slots = threading.BoundedSemaphore(1)
    slots.acquire()
    monkeypatch.setattr(allowlist, "_lookup_slots", slots)
    monkeypatch.setattr(allowlist, "RESOLVE_TIMEOUT_S", 0.05)
    with pytest.raises(AdvisorError) as refused:
        allowlist.system_resolver("localhost")
    assert not isinstance(refused.value, allowlist.LookupTimedOut)
    assert str(refused.value) == ("dest host 'localhost' was not looked up: this service's 8 name lookups were all "
                                  "busy for 0.05 s: try again later, or give its address")
    assert refused.value.retry_after_s == 0.05


def test_a_lookup_whose_thread_cannot_start_is_refused_as_not_looked_up_and_gives_its_slot_back(monkeypatch):
    # At the process's thread limit Thread.start raises RuntimeError: it went out of the resolver as a 500, and
    # the slot it had taken was never given back (8 such and no name would resolve again).
    import threading

    import advisor.allowlist as allowlist
    from advisor.errors import AdvisorError

    slots = threading.BoundedSemaphore(1)
    monkeypatch.setattr(allowlist, "_lookup_slots", slots)
    real_start = threading.Thread.start

    def start(thread):
        if thread.name == "tame-resolve":
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(AdvisorError, match="'localhost' was not looked up: this service could not start a lookup"):
        allowlist.system_resolver("localhost")
    assert slots.acquire(blocking=False)


def _take_every_lookup_slot(monkeypatch):
    """advisor.allowlist.system_resolver with every lookup slot taken: it refuses each name after 0.01 s."""
    import threading

    import advisor.allowlist as allowlist

    slots = threading.BoundedSemaphore(1)
    slots.acquire()
    monkeypatch.setattr(allowlist, "_lookup_slots", slots)
    monkeypatch.setattr(allowlist, "RESOLVE_TIMEOUT_S", 0.01)
    return allowlist.system_resolver


BUSY = "was not looked up: this service's 8 name lookups were all busy for 0.01 s: try again later, or give its address"


def test_a_name_refused_because_lookups_were_busy_is_not_remembered_as_slow_nor_forgotten(tmp_path, monkeypatch):
    # A busy refusal was a LookupTimedOut: the name went to the slow ones, checked last, though it was never looked
    # up. Now it is refused saying so, and the service's memory of the site's slow names is left as it was.
    from advisor.errors import LookupTimedOut
    from advisor.sites import SiteBudget

    busy = None

    def resolver(host):
        if busy is not None:
            return busy(host)
        if host == "slow.example":
            raise LookupTimedOut(f"dest host {host!r} did not resolve within 5 s", retry_after_s=5.0)
        return ["127.0.0.5"]

    store, service = _slow_name_service(tmp_path, resolver, LookupClock())
    budget = SiteBudget(2, 64, 3600.0)
    try:
        service.register_site("dtn2", budget, ["slow.example:5201"])
        assert len(service._slow_names) == 1
        busy = _take_every_lookup_slot(monkeypatch)
        got = service.register_site("dtn2", budget, ["slow.example:5201", "new.example:5201"])
        assert {r["dest"]: r["error"] for r in got["refused"]} == {
            f"{host}:5201": f"dest host {host!r} {BUSY}" for host in ("new.example", "slow.example")}
        assert len(service._slow_names) == 1  # slow.example still, and new.example not
    finally:
        store.close()


def test_a_claim_whose_name_lookup_could_not_start_hands_the_job_back_uncounted_to_wait(tmp_path, monkeypatch):
    # The claimed job's destination could not be looked up (lookups busy): it failed an attempt, "not run: did not
    # resolve within 5 s", and after TAME_MAX_PROBE_ATTEMPTS such claims the job failed for good. Then it went back in
    # its place at once, the attempt not counted, so every claim of the site looked it up again and gave none. Now it
    # also waits the refusal's retry_after_s before it is claimed again, no name looked up meanwhile.
    from advisor.sites import SiteBudget
    from tests.api.conftest import Clock

    busy, looked_up = None, []

    def resolver(host):
        looked_up.append(host)
        return ["127.0.0.5"] if busy is None else busy(host)

    clock = Clock()
    store, service = _slow_name_service(tmp_path, resolver, LookupClock(), store_clock=clock)
    try:
        assert service.register_site("dtn2", SiteBudget(2, 64, 3600.0), ["n.example:5201"])["queued"] == 1
        busy = _take_every_lookup_slot(monkeypatch)
        looked_up.clear()
        got = service.claim("dtn2", "agent-1", 64)
        assert got["job"] is None and looked_up == ["n.example"]
        assert got["waiting"] == f"the probe of n.example:5201 could not start: dest host 'n.example' {BUSY}"
        with store.db.transaction() as tx:
            [(job_id,)] = tx.execute("SELECT id FROM probe_jobs").fetchall()
        job = store.job(job_id)
        assert (job.status, job.attempts) == ("queued", 0)
        assert job.error == f"not started: dest host 'n.example' {BUSY}; re-queued, tried again in 0.01 s"
        busy = None
        for _ in range(service.settings.max_probe_attempts + 1):  # waiting: nothing is looked up
            got = service.claim("dtn2", "agent-1", 64)
            assert got["job"] is None and looked_up == ["n.example"], got
            assert got["waiting"].endswith("or their name lookups did not finish as they were to start (the first "
                                           "is tried again in 1 s)"), got["waiting"]
        clock.advance(0.01)
        got = service.claim("dtn2", "agent-1", 64)
        assert got["job"]["status"] == "running" and got["job"]["attempts"] == 1, got["job"]
    finally:
        store.close()


def test_a_name_that_stays_slow_waits_longer_each_time_lets_the_site_s_other_probes_go_and_fails_at_last(tmp_path):
    # A claimed job whose name lookup timed out (LookupTimedOut, an InvalidRequest then) failed an attempt: three slow
    # DNS moments and the job failed for good. Now the attempt is not counted: the job goes behind the site's other
    # probes, waits 5 s, then twice as long each time its lookup times out again (at most an hour), and the 12th time
    # (about 2.4 hours of a name that never resolves in time) it fails, saying why.
    from advisor.sites import SiteBudget
    from advisor.jobs import MAX_LOOKUP_WAITS
    from tests.api.conftest import Clock

    clock = Clock()
    dns = SlowDNS(LookupClock(), [], each_s=0)
    store, service = _slow_name_service(tmp_path, dns, LookupClock(), store_clock=clock)
    budget = SiteBudget(2, 64, 3600.0)

    def job(dest):
        with store.db.transaction() as tx:
            [(job_id,)] = tx.execute("SELECT id FROM probe_jobs WHERE dest = ?", (dest,)).fetchall()
        return store.job(job_id)

    try:
        assert service.register_site("dtn2", budget, ["slow.example:5201"])["queued"] == 1
        clock.advance(1)  # n.example's probe queued after slow.example's
        assert service.register_site("dtn2", budget, ["slow.example:5201", "n.example:5201"])["queued"] == 1
        assert service.register_site("dtn3", budget, ["slow3.example:5201"])["queued"] == 1
        dns.slow.update({"slow.example", "slow3.example"})
        dns.looked_up.clear()  # the registrations' lookups
        got = service.claim("dtn2", "agent-1", 64)
        assert got["job"] is None and got["waiting"] == ("the probe of slow.example:5201 could not start: dest host "
                                                         "'slow.example' did not resolve within 0 s")
        # The next claim gives the site's other probe: the slow name does not hold the head of its site's queue.
        assert service.claim("dtn2", "agent-1", 64)["job"]["dest"] == "n.example:5201"

        waits = []
        for looked_up in range(1, MAX_LOOKUP_WAITS + 1):
            assert service.claim("dtn3", "agent-3", 64)["job"] is None
            assert dns.looked_up.count("slow3.example") == looked_up
            slow = job("slow3.example:5201")
            if slow.status != "queued":
                break
            assert slow.attempts == 0
            waits.append(float(slow.error.rsplit("tried again in ", 1)[1].removesuffix(" s")))
            clock.advance(waits[-1] - 0.001)
            assert service.claim("dtn3", "agent-3", 64)["job"] is None  # not yet: nothing looked up
            assert dns.looked_up.count("slow3.example") == looked_up
            clock.advance(0.001)
        # 5 s, 10 s, ... 2560 s, then an hour; the 12th time it fails: 8715 s of waits.
        assert waits == [5.0 * 2 ** n for n in range(10)] + [3600.0]
        assert (slow.status, slow.attempts) == ("failed", 1)
        assert slow.error == (f"never run: its name lookup did not finish as it was to start, {MAX_LOOKUP_WAITS} "
                              "times; the last time: dest host 'slow3.example' did not resolve within 0 s")
    finally:
        store.close()


def test_a_registration_of_slow_names_answers_before_tame_agent_stops_waiting(tmp_path):
    # Each name here waits RESOLVE_TIMEOUT_S for a lookup slot, then as long again for its answer: the most a lookup
    # takes since a name's deadline starts at its slot. A registration started lookups for 30 s, so it answered at
    # 40 s; tame agent waits 30 s for it, so every round of a site listing a few such names (six of 5 s) failed,
    # unanswered, and its agent never claimed a probe, of its good links either.
    from advisor.allowlist import RESOLVE_TIMEOUT_S
    from advisor.commands.agent import SERVICE_TIMEOUT_S
    from advisor.sites import SiteBudget

    clock = LookupClock()
    slow = [f"slow{i}.example" for i in range(20)]
    dns = SlowDNS(clock, slow, each_s=2 * RESOLVE_TIMEOUT_S)
    store, service = _slow_name_service(tmp_path, dns, clock)
    try:
        got = service.register_site("dtn2", SiteBudget(2, 64, 3600.0), [f"{name}:5201" for name in slow])
        assert clock() <= SERVICE_TIMEOUT_S - 5, clock()  # some seconds left for the rest of the request
        assert len(got["refused"]) == len(slow) and dns.looked_up
    finally:
        store.close()
