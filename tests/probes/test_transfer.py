"""`tame transfer` on the real kernel: a short transfer through a test bed, in both forms, with tame loaded.

Root and kernel-wide: the tame registration and its FM map are shared by every process, so run this under
the lock the project's tame users share (flock /tmp/tame-cc.lock pytest ...). A registration that is there
already is used and left as it is; otherwise the test registers tame and unregisters it after.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from advisor.allowlist import AllowList
from advisor.commands.cc import setting_for
from advisor.destinations import parse_destination
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from probes import cc, cc_map, pathcheck, testbed
from probes.result import ProbeResult
from tests.probes.fm_map import fill_with_entries_of
from tests.sites import SITE

netns = pytest.mark.netns
PATH = testbed.TestbedSpec(rate_bps=50e6, rtt_s=0.020, queue_bytes=125_000)
FRACTIONAL_PORT = 5202
SEEDED_RTT_S = 0.04
# Probes that follow Lu's model exactly, BW(n) = n / sqrt(A n^2 + B): at budget 0.1 the advice is n* 2.3747
# (2 standard streams and a fractional one), at 0.2 seven whole streams (worked out with the service's fit).
A, B = 2e-18, 4e-16
FRACTIONAL_BUDGET, WHOLE_BUDGET = 0.1, 0.2
TRANSFER_S = 3


def rate(n: int) -> float:
    return n / (A * n * n + B) ** 0.5


@pytest.fixture
def tame_loaded():
    """tame registered for the test: one there already is used (not ours to unload), else ours for the test."""
    reg, new = cc.load()
    try:
        yield reg
    finally:
        if new:
            cc.unload()


@pytest.fixture
def seeded(tmp_path, testbed_path):
    """A store with a fit for the bed's receiver (pushed probe results, as POST /v1/probe-runs stores them)."""
    url = f"sqlite:///{tmp_path / 'tame.sqlite3'}"
    settings = Settings(database_url=url, allowed=AllowList.parse("10.201.0.0/16"))
    store = Store.open(url)
    dest = parse_destination(testbed_path.server_addr)
    results = [ProbeResult(dest=dest.key, streams=n, duration_s=10.0, omit_s=0.0, throughput_bps=rate(n),
                           sender_bps=rate(n)) for n in (1, 4, 10)]
    # Probed under the control the sender's standard streams run, as a probe from there would record it.
    _, error = AdviceService(store, settings).ingest_run(dest, SEEDED_RTT_S, results, time.time(), source="push",
                                                         congestion_control=_standard_control(testbed_path))
    assert error is None
    try:
        yield store, settings, dest
    finally:
        store.close()


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAME_")}
    # TAME_SITE kept: the transfer's link is the seeded one, from the site the tests run as.
    return {**env, "TAME_DATABASE_URL": url, "TAME_ALLOWED_DESTINATIONS": "10.201.0.0/16", "TAME_SITE": SITE}


def _transfer(tb_path, url: str, *args: str) -> tuple[dict, list[float], str]:
    """Run `tame transfer --json` in the sender namespace; returns its JSON, the FMs the map held for the
    receiver while it ran (sampled) and its stderr."""
    addr = ipaddress.ip_address(tb_path.server_addr)
    proc = subprocess.Popen(tb_path.in_sender([sys.executable, "-m", "advisor", "transfer", tb_path.server_addr,
                                               "--duration", str(TRANSFER_S), "--json", *args]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(url))
    seen = []
    try:
        deadline = time.monotonic() + TRANSFER_S + 60
        while proc.poll() is None and time.monotonic() < deadline:
            entry = _sender_entries(tb_path).get(addr)
            if entry is not None:
                seen.append(entry.fractional_multiplier)
            time.sleep(0.2)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    return json.loads(out), seen, err


_cookies: dict[tuple[str, int], int] = {}


def _sender_entries(tb_path) -> dict:
    """The FM map's entries for the sender namespace's sockets (the namespace `tame transfer` runs in)."""
    ns = tb_path.testbed.sender_ns
    ident = (ns, os.stat(f"/run/netns/{ns}").st_ino)  # a namespace made again under the name is another
    if ident not in _cookies:
        _cookies[ident] = cc_map.netns_cookie(ns)
    return cc_map.settings(_cookies[ident])


def _standard_control(tb_path) -> str:
    return subprocess.run(tb_path.in_sender(["cat", "/proc/sys/net/ipv4/tcp_congestion_control"]),
                          capture_output=True, text=True, check=True, timeout=10).stdout.strip()


@netns
@pytest.mark.parametrize("testbed_path", [PATH], indirect=True)
def test_a_real_transfer_opens_the_advice_in_both_forms_and_stores_what_it_got(tame_loaded, testbed_path, seeded):
    store, settings, dest = seeded
    addr = ipaddress.ip_address(testbed_path.server_addr)
    before = _sender_entries(testbed_path).get(addr)
    control = _standard_control(testbed_path)
    fits_used = store.current_fit(dest.key, control, src=SITE).observations_used

    with pathcheck.iperf3_server(testbed_path.testbed, FRACTIONAL_PORT):
        # Fractional form: 2 standard streams (the sender's own control) + 1 tame stream on the second port.
        got, seen, _ = _transfer(testbed_path, settings.database_url, "--max-impact", str(FRACTIONAL_BUDGET))
        assert set(got) == {"src", "dest", "advice", "opened", "throughput_bps", "duration_s", "observation_id"}
        assert got["src"] == SITE
        assert set(got["opened"]) == {"standard_streams", "fractional_multiplier", "congestion_control", "streams"}
        n_star = got["advice"]["tcp_equivalent_streams"]
        assert n_star == pytest.approx(2.3747, abs=1e-3)
        # The FM is the calibrated law's for the sender's control at the fit's RTT, as `tame cc apply` sets it.
        expected_fm = setting_for(n_star, None, SEEDED_RTT_S, control).fractional_multiplier
        assert got["opened"] == {"standard_streams": 2, "fractional_multiplier": expected_fm,
                                 "congestion_control": cc.NAME, "streams": 3}
        assert got["advice"]["open"]["command"].startswith(f"tame cc apply {addr} --tcp-equivalent ")
        assert expected_fm in seen  # the entry held the FM during the transfer
        assert _sender_entries(testbed_path).get(addr) == before  # and was put back after
        assert got["throughput_bps"] > 0 and got["duration_s"] >= TRANSFER_S - 0.5
        _, _, _, observed = store.observation(got["observation_id"])
        # iperf3 reported each client's control: the standard ones ran the sender's, the fractional one tame.
        assert observed.stream_congestion_controls == (control, control, cc.NAME)
        assert observed.fractional_multiplier == expected_fm and observed.tame_streams == 1
        assert len(observed.stream_bps) == 3 and len(observed.stream_retransmits) == 3
        assert observed.throughput_bps == pytest.approx(got["throughput_bps"])
        assert store.current_fit(dest.key, control, src=SITE).observations_used == fits_used  # stored, not used to refit

        # Aggregate form: 4 tame streams, each at the FM that makes 4 of them take n*'s share.
        got, seen, _ = _transfer(testbed_path, settings.database_url, "--max-impact", str(FRACTIONAL_BUDGET),
                              "--streams", "4")
        expected_fm = setting_for(n_star, 4, SEEDED_RTT_S, control).fractional_multiplier
        assert got["opened"] == {"standard_streams": 0, "fractional_multiplier": expected_fm,
                                 "congestion_control": cc.NAME, "streams": 4}
        assert expected_fm in seen
        assert _sender_entries(testbed_path).get(addr) == before
        _, _, _, observed = store.observation(got["observation_id"])
        assert observed.stream_congestion_controls == (cc.NAME,) * 4 and observed.tame_streams == 4

        # A whole n*: standard streams alone, no tame entry at all; this observation feeds the refit.
        got, seen, _ = _transfer(testbed_path, settings.database_url, "--max-impact", str(WHOLE_BUDGET))
        assert got["opened"] == {"standard_streams": 7, "fractional_multiplier": None,
                                 "congestion_control": control, "streams": 7}
        assert seen == ([before.fractional_multiplier] * len(seen) if before else [])
        _, _, _, observed = store.observation(got["observation_id"])
        assert observed.stream_congestion_controls == (control,) * 7 and observed.tame_streams == 0
        assert store.current_fit(dest.key, control, src=SITE).observations_used == fits_used + 1
    assert _sender_entries(testbed_path).get(addr) == before


@netns
@pytest.mark.parametrize("testbed_path", [PATH], indirect=True)
def test_a_transfer_on_a_full_map_removes_the_entries_of_namespaces_that_are_gone_and_says_so(
        tame_loaded, testbed_path, seeded, tmp_path):
    # A namespace that set entries and went (cookies are never reused): its entries fill the map. The transfer's
    # own entry only fits once they are gone, and the user is told what went, as `tame cc apply` tells it.
    _, settings, _ = seeded
    addr = ipaddress.ip_address(testbed_path.server_addr)
    gone = f"ttr-{os.getpid()}-gone"
    subprocess.run(["ip", "netns", "add", gone], check=True, timeout=10)
    try:
        cookie = cc_map.netns_cookie(gone)
    finally:
        subprocess.run(["ip", "netns", "del", gone], check=True, timeout=10)
    before = _sender_entries(testbed_path).get(addr)
    added = fill_with_entries_of(cookie, tmp_path)
    try:
        with pathcheck.iperf3_server(testbed_path.testbed, FRACTIONAL_PORT):
            got, seen, err = _transfer(testbed_path, settings.database_url, "--max-impact", str(FRACTIONAL_BUDGET))
        assert got["opened"]["fractional_multiplier"] in seen
        assert (f"tame transfer: the {cc.FM_MAP} map was full: removed {added} entries of network namespaces that "
                f"are gone (cookie {cookie}: 10.66.0.0, 10.66.0.1, 10.66.0.2, 10.66.0.3, 10.66.0.4 and "
                f"{added - 5} more)") in err, err
        assert not [key for key in cc_map.all_settings() if key[0] == cookie]
        assert _sender_entries(testbed_path).get(addr) == before
    finally:
        cc_map.prune_gone()  # what a failed test left of the fill


@contextmanager
def fm_set_by_transfer(tb_path, url: str, duration_s: float, *argv_before: str, default_signals: bool = False):
    """A `tame transfer` (fractional form, ``--duration duration_s --json``) started in the sender namespace (under
    ``argv_before``, e.g. nohup), yielded once it has set the receiver's FM entry; killed if still running after the
    block. ``default_signals``: start it with SIGINT and SIGHUP at their defaults, as from a terminal (a shell without
    job control, CI's, starts background commands with SIGINT ignored, which Python does not turn into Ctrl-C)."""
    addr = ipaddress.ip_address(tb_path.server_addr)
    before = _sender_entries(tb_path).get(addr)
    restore = (lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGHUP)]) \
        if default_signals else None
    proc = subprocess.Popen(tb_path.in_sender([*argv_before, sys.executable, "-m", "advisor", "transfer",
                                               tb_path.server_addr, "--duration", str(duration_s), "--json",
                                               "--max-impact", str(FRACTIONAL_BUDGET)]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(url),
                            preexec_fn=restore)
    try:
        deadline = time.monotonic() + 30
        while _sender_entries(tb_path).get(addr) == before:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@netns
@pytest.mark.parametrize("testbed_path", [PATH], indirect=True)
@pytest.mark.parametrize("signals", [("SIGHUP",), ("SIGINT", "SIGINT")], ids=["hang-up", "ctrl-c-twice"])
def test_a_transfer_ended_by_a_hang_up_or_a_second_ctrl_c_puts_the_fm_entry_back(tame_loaded, testbed_path, seeded,
                                                                                signals):
    """The terminal going away (SIGHUP), or Ctrl-C pressed again while the first one's clean-up runs, must not
    leave the transfer's FM set for the address: the next transfer would take it for the entry to put back."""
    _, settings, _ = seeded
    addr = ipaddress.ip_address(testbed_path.server_addr)
    before = _sender_entries(testbed_path).get(addr)
    with pathcheck.iperf3_server(testbed_path.testbed, FRACTIONAL_PORT), \
            fm_set_by_transfer(testbed_path, settings.database_url, 20, default_signals=True) as proc:
        time.sleep(0.5)  # its clients are running
        for name in signals:
            proc.send_signal(getattr(signal, name))
            time.sleep(0.01)
        proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert _sender_entries(testbed_path).get(addr) == before


@netns
@pytest.mark.parametrize("testbed_path", [PATH], indirect=True)
def test_a_transfer_started_with_nohup_keeps_going_through_a_hang_up(tame_loaded, testbed_path, seeded):
    """`nohup tame transfer ...`: SIGHUP ignored by its caller stays ignored, so the terminal going away does not
    end the transfer; it completes, is stored and puts its FM entry back."""
    store, settings, _ = seeded
    addr = ipaddress.ip_address(testbed_path.server_addr)
    before = _sender_entries(testbed_path).get(addr)
    with pathcheck.iperf3_server(testbed_path.testbed, FRACTIONAL_PORT), \
            fm_set_by_transfer(testbed_path, settings.database_url, 4, "nohup") as proc:
        time.sleep(0.5)
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["observation_id"] is not None
    assert _sender_entries(testbed_path).get(addr) == before


@netns
@pytest.mark.parametrize("testbed_path", [PATH], indirect=True)
def test_a_transfer_across_an_unload_completes_and_stores_what_it_got(testbed_path, seeded):
    """`tame cc unload` while a transfer's tame stream runs: the kernel keeps the control for that socket until it
    closes, so the transfer completes and is reported; its FM entry went with the map, so there is none to put back."""
    store, settings, _ = seeded
    reg, ours = cc.load()
    if not ours:
        cc_owner = f"struct_ops id {reg.struct_ops_id}"
        pytest.skip(f"tame is registered by someone else ({cc_owner}): this test must not unload it")
    try:
        with pathcheck.iperf3_server(testbed_path.testbed, FRACTIONAL_PORT), \
                fm_set_by_transfer(testbed_path, settings.database_url, 6) as proc:
            time.sleep(1.0)  # its tame stream is connected under the control
            assert cc.unload()
            out, err = proc.communicate(timeout=60)
    finally:
        cc.unload()
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert report["opened"]["fractional_multiplier"] > 1 and report["observation_id"] is not None
    _, _, _, observed = store.observation(report["observation_id"])
    assert observed.tame_streams == 1 and observed.stream_bps[-1] > 0


@netns
@pytest.mark.parametrize("testbed_path", [PATH], indirect=True)
def test_a_second_transfer_or_apply_to_an_address_a_transfer_is_using_is_refused(tame_loaded, testbed_path, seeded):
    """Two transfers to one address would share its FM entry (the first to end would put it back under the other):
    while one runs, another, or `tame cc apply` for that address, exits 2 and changes nothing."""
    _, settings, _ = seeded
    addr = ipaddress.ip_address(testbed_path.server_addr)
    before = _sender_entries(testbed_path).get(addr)
    transfer = [sys.executable, "-m", "advisor", "transfer", testbed_path.server_addr, "--max-impact",
                str(FRACTIONAL_BUDGET)]
    with pathcheck.iperf3_server(testbed_path.testbed, FRACTIONAL_PORT), \
            fm_set_by_transfer(testbed_path, settings.database_url, 8) as first:
        held = _sender_entries(testbed_path).get(addr)
        for argv in ([*transfer, "--duration", "2", "--streams", "4"],
                     [sys.executable, "-m", "advisor", "cc", "apply", str(addr), "--tcp-equivalent", "1.5"]):
            second = subprocess.run(testbed_path.in_sender(argv), capture_output=True, text=True, timeout=60,
                                    env=_env(settings.database_url))
            assert second.returncode == 2 and "run one at a time per address" in second.stderr, second.stderr
            assert _sender_entries(testbed_path).get(addr) == held
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert _sender_entries(testbed_path).get(addr) == before
