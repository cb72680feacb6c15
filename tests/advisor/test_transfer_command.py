"""`tame transfer`: bad and hostile input is refused with exit status 2 and a message saying what to give,
before any process runs or anything is stored. (The real transfer: tests/probes/test_transfer.py, root.)"""

import math
import time

import pytest

from advisor.allowlist import AllowList
from advisor.cli import main
from advisor.commands import transfer
from advisor.destinations import parse_destination
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from probes import cc, cc_map, cc_routes
from probes.result import ProbeResult
from probes import transfer as probe_transfer

# Lu's model exactly, BW(n) = n / sqrt(A n^2 + B): at budget 0.1 the service advises n* 2.3747.
A, B = 2e-18, 4e-16
DEST = "10.201.2.1"


def rate(n, scale=1.0):
    """Lu's BW(n), bits/s, times ``scale`` (which leaves n* as it is)."""
    return scale * n / math.sqrt(A * n * n + B)


def _no_processes(*args, **kwargs):
    raise AssertionError(f"refused input must not reach a system command: {args}")


@pytest.fixture
def store_url(tmp_path, monkeypatch):
    """A store holding a fit for DEST:5201, and the environment pointing the CLI at it; no process may run."""
    return _store_url(tmp_path, monkeypatch, 1.0)


def _store_url(tmp_path, monkeypatch, scale):
    url = f"sqlite:///{tmp_path / 'tame.sqlite3'}"
    store = Store.open(url)
    settings = Settings(database_url=url, allowed=AllowList.parse("10.201.0.0/16"))
    dest = parse_destination(DEST)
    results = [ProbeResult(dest=dest.key, streams=n, duration_s=10.0, omit_s=0.0, throughput_bps=rate(n, scale),
                           sender_bps=rate(n, scale)) for n in (1, 4, 10)]
    assert AdviceService(store, settings).ingest_run(dest, 0.04, results, time.time(), source="push")[1] is None
    store.close()
    monkeypatch.delenv("TAME_URL", raising=False)
    monkeypatch.setenv("TAME_DATABASE_URL", url)
    monkeypatch.setenv("TAME_ALLOWED_DESTINATIONS", "10.201.0.0/16")
    for module in (cc, cc_map, cc_routes):
        monkeypatch.setattr(module, "run", _no_processes)
    monkeypatch.setattr(probe_transfer.subprocess, "Popen", _no_processes)
    return url


def _rows(url: str) -> dict[str, int]:
    store = Store.open(url)
    try:
        with store.db.transaction() as tx:
            return {table: tx.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                    for table in ("observations", "fits", "probe_jobs", "probe_runs")}
    finally:
        store.close()


def _transfer(*argv: str) -> int:
    try:
        return main(["transfer", *argv])
    except SystemExit as exc:  # argparse's refusals
        return exc.code


SIZE = ["--duration", "3"]


@pytest.mark.parametrize("argv, says", [
    ([DEST, "--max-impact", "0", *SIZE], "outside (0, 1]"),
    ([DEST, "--max-impact", "1.5", *SIZE], "outside (0, 1]"),
    ([DEST, "--max-impact", "-0.1", *SIZE], "outside (0, 1]"),
    ([DEST, "--max-impact", "nan", *SIZE], "'nan' is not a number; give a fraction"),
    ([DEST, "--max-impact", "inf", *SIZE], "'inf' is not a number; give a fraction"),
    ([DEST, "--max-impact", "10%", *SIZE], "not a number"),
    # Were read by float() as 0.1 and 10 (advisor.limits.parse_number is the one rule).
    ([DEST, "--max-impact", "\uff10.\uff11", *SIZE], "not a number"),
    ([DEST, "--max-impact", "0.1", "--duration", "1_0"], "not a number of seconds"),
    ([DEST, "--max-impact", "0.1", "--duration", "\u0661\u0660"], "not a number of seconds"),
    ([DEST, "--max-impact", "0.1", "--duration", "10", "--timeout", "\uff16\uff10"], "not a number of seconds"),
    ([DEST, "--max-impact", "0.1"], "one of the arguments --duration --bytes is required"),
    ([DEST, "--max-impact", "0.1", "--duration", "3", "--bytes", "1000"], "not allowed with"),
    ([DEST, "--max-impact", "0.1", "--duration", "-3"], "outside 1..86400"),
    ([DEST, "--max-impact", "0.1", "--duration", "0"], "outside 1..86400"),
    ([DEST, "--max-impact", "0.1", "--duration", "nan"], "'nan' is not a number of seconds"),
    ([DEST, "--max-impact", "0.1", "--duration", "1e9"], "outside 1..86400"),
    ([DEST, "--max-impact", "0.1", "--bytes", "-5"], "outside 1.."),
    ([DEST, "--max-impact", "0.1", "--bytes", "0"], "outside 1.."),
    ([DEST, "--max-impact", "0.1", "--bytes", "1.5"], "not a whole number of bytes"),
    ([DEST, "--max-impact", "0.1", "--bytes", str(2**60)], "outside 1.."),
    ([DEST, "--max-impact", "0.1", *SIZE, "--streams", "0"], "outside 1..128"),
    ([DEST, "--max-impact", "0.1", *SIZE, "--streams", "129"], "outside 1..128"),
    ([DEST, "--max-impact", "0.1", *SIZE, "--streams", "two"], "not a whole number"),
    ([DEST, "--max-impact", "0.1", *SIZE, "--fractional-port", "0"], "outside 1..65535"),
    ([DEST, "--max-impact", "0.1", *SIZE, "--fractional-port", "70000"], "outside 1..65535"),
    ([DEST, "--max-impact", "0.1", *SIZE, "--timeout", "-1"], "outside 1..86400"),
    ([DEST, "--max-impact", "0.1", *SIZE, "--timeout", "2"], "--timeout 2 s is shorter than --duration 3 s"),
    # n* 2.3747: fewer than 3 streams cannot carry it (tame only slows streams down).
    ([DEST, "--max-impact", "0.1", *SIZE, "--streams", "2"], "open at least 3"),
    # A budget even the smallest tame stream breaks (n* below 0.05): nothing to open, nothing run.
    ([DEST, "--max-impact", "0.001", *SIZE], "opens nothing"),
    # The tame stream needs a second server port.
    ([DEST, "--max-impact", "0.1", *SIZE, "--fractional-port", "5201"], "is DEST's own port"),
    (["host.example", "--max-impact", "0.1", *SIZE], "not an IPv4 or IPv6 address"),
    (["10.201.2.0/24", "--max-impact", "0.1", *SIZE], "DEST"),
    (["10.201.2.1; rm -rf /", "--max-impact", "0.1", *SIZE], "DEST"),
    (["[fd00::1", "--max-impact", "0.1", *SIZE], "DEST"),
    (["a" * 5000, "--max-impact", "0.1", *SIZE], "too long"),
    (["10.201.2.1 10.201.2.2", "--max-impact", "0.1", *SIZE], "DEST"),
    (["fe80::1%eth0", "--max-impact", "0.1", *SIZE], "not supported"),
    (["0.0.0.0", "--max-impact", "0.1", *SIZE], "not a unicast address"),
    # No advice for this destination yet.
    (["10.201.2.9", "--max-impact", "0.1", *SIZE], "no advice from test-site to 10.201.2.9:5201"),
    # Outside the allow-list: refused before the transfer, not after it.
    (["10.99.0.1", "--max-impact", "0.1", *SIZE], "no advice"),
])
def test_bad_input_exits_2_saying_what_to_give_and_stores_nothing(store_url, argv, says, capsys):
    before = _rows(store_url)
    assert _transfer(*argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tame transfer: ") and says in err, err
    assert "Traceback" not in err
    assert _rows(store_url) == before


def test_tame_streams_without_root_exit_2_saying_to_load_tame_as_root(store_url, monkeypatch, capsys):
    monkeypatch.setattr(transfer.os, "geteuid", lambda: 1000)
    before = _rows(store_url)
    for extra in ([], ["--streams", "4"]):
        assert _transfer(DEST, "--max-impact", "0.1", *SIZE, *extra) == 2
        err = capsys.readouterr().err
        assert "not running as root" in err and "'tame cc load' as root" in err
    assert _rows(store_url) == before


@pytest.mark.parametrize("streams, warned", [("64", True), ("4", False)])
def test_aggregate_streams_past_the_fitted_fm_are_warned_of(store_url, monkeypatch, capsys, streams, warned):
    monkeypatch.setenv("TAME_CONGESTION_CONTROL", "cubic")  # advice under the measured aggregate law's control
    monkeypatch.setattr(transfer.os, "geteuid", lambda: 1000)  # stops before anything runs
    assert _transfer(DEST, "--max-impact", "0.1", *SIZE, "--streams", streams) == 2
    err = capsys.readouterr().err
    from models.tame_share import AGGREGATE_LAWS

    past = f"past the FM {AGGREGATE_LAWS['cubic'].max_calibrated_fm:g}"
    assert "not running as root" in err, err  # it got as far as the root check, past where it warns
    assert ("tame transfer: warning: the tame stream's FM" in err and past in err) == warned, err


@pytest.mark.parametrize("scale, streams, says", [
    (1.0, "64", None),  # 64 streams' floor at 40 ms is 0.32 of n*'s 117 Mbit/s
    (0.01, "4", "open the fractional form (no --streams)"),  # n* takes 1.17 Mbit/s: 4 streams' floor is 2.0x that
    (0.03, "8", "open at most 4 streams"),
    # n* takes 117 kbit/s: one stream's floor (579 kbit/s at 40 ms) is 4.95x that, in either form
    (0.001, "4", "not even one stream goes that low at this RTT: any TCP transfer here sends at least 4.95 of n*'s share"),
])
def test_aggregate_streams_whose_window_floor_exceeds_n_star_s_share_are_warned_of(tmp_path, monkeypatch, capsys,
                                                                                     scale, streams, says):
    url = _store_url(tmp_path, monkeypatch, scale)
    monkeypatch.setenv("TAME_CONGESTION_CONTROL", "cubic")
    monkeypatch.setattr(transfer.os, "geteuid", lambda: 1000)  # stops before anything runs
    before = _rows(url)
    assert _transfer(DEST, "--max-impact", "0.1", *SIZE, "--streams", streams) == 2
    err = capsys.readouterr().err
    assert "not running as root" in err, err  # it got as far as the root check, past where it warns
    floor = [line for line in err.splitlines() if "segments of 1448 bytes a round trip each" in line]
    if says is None:
        assert floor == [], err
    else:
        assert len(floor) == 1 and floor[0].startswith(f"tame transfer: warning: {streams} tame streams at RTT 40.0 ms")
        assert floor[0].endswith(says), floor
    assert _rows(url) == before


def test_the_fractional_form_splits_bytes_by_each_part_s_share_of_n_star():
    from advisor.advice import Advice

    advice = Advice(num_flows=2, fractional_multiplier=4.0, tcp_equivalent_streams=2.5,
                    max_nondisruptive_throughput_bps=1e8, cross_traffic_impact=0.05, max_impact=0.1,
                    per_stream_buffer_bytes=None, model="lu", params={}, regime="congested")
    opened = transfer.plan_opening(advice, parse_destination(DEST), 0.04, "bbr", None, 5202, 1_000_000)
    # 2 of n* 2.5 go to the standard streams, 0.5 to the tame one: 800 000 and 200 000 bytes; FM 1/0.5^2.
    assert [(c.port, c.streams, c.congestion_control, c.bytes) for c in opened.clients] == [
        (5201, 2, "bbr", 800_000), (5202, 1, "tame", 200_000)]
    assert opened.fractional_multiplier == 4.0
    assert opened.to_json() == {"standard_streams": 2, "fractional_multiplier": 4.0, "congestion_control": "tame",
                                "streams": 3}


def test_the_aggregate_form_with_as_many_streams_as_n_star_opens_standard_streams_of_the_probed_control():
    from advisor.advice import Advice

    advice = Advice(num_flows=3, fractional_multiplier=None, tcp_equivalent_streams=3.0,
                    max_nondisruptive_throughput_bps=1e8, cross_traffic_impact=0.05, max_impact=0.1,
                    per_stream_buffer_bytes=None, model="lu", params={}, regime="congested")
    opened = transfer.plan_opening(advice, parse_destination(DEST), 0.04, "cubic", 3, 5202, 1_000_000)
    # Tame at FM 1 (Reno) would take less than a cubic stream each: three cubic streams are n*'s share.
    assert [(c.port, c.streams, c.congestion_control, c.bytes) for c in opened.clients] == [(5201, 3, "cubic", 1_000_000)]
    assert opened.to_json() == {"standard_streams": 3, "fractional_multiplier": None, "congestion_control": "cubic",
                                "streams": 3}
