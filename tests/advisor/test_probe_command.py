"""`tame probe` with the fake driver in place of iperf3 (the real driver has its own tests)."""

import argparse
import dataclasses
import json

import pytest

from advisor.cli import COMMANDS, UsageError
from advisor.commands import probe
from probes.errors import NothingListening
from probes.fake import FakeDriver


def parse(*argv):
    parser = argparse.ArgumentParser(prog="tame")
    probe.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["probe", *argv])


@pytest.fixture
def fake(monkeypatch):
    driver = FakeDriver(lambda n: 30e6 * n / (1 + 0.2 * n), rtt_s=0.03, retransmits_per_stream=2)
    monkeypatch.setattr(probe, "IperfDriver", lambda congestion_control=None: driver)
    return driver


def test_probe_is_a_registered_command():
    assert "probe" in COMMANDS


def test_json_output_has_the_documented_shape(fake, capsys):
    args = parse("192.0.2.7:5300", "--levels", "1,10", "--duration", "10", "--json")
    assert args.handler(args) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["dest"] == "192.0.2.7:5300" and doc["idle_rtt_s"] == 0.03
    assert [p["streams"] for p in doc["probes"]] == [1, 10]
    for p in doc["probes"]:
        assert {"streams", "throughput_bps", "sender_bps", "retransmits", "rtt_mean_s", "duration_s"} <= set(p)
    assert doc["probes"][1]["retransmits"] == 20
    assert "idle RTT" in err and "[2/2]" in err  # progress goes to stderr, results to stdout


def test_default_port_and_options_reach_the_plan(fake, capsys):
    args = parse("192.0.2.7", "--levels", "2,8", "--duration", "12", "--omit", "3")
    assert args.handler(args) == 0
    runs = [c for c in fake.calls if c[0] == "run"]
    assert [(c[1], c[2], c[3], c[4]) for c in runs] == [("192.0.2.7:5201", 2, 12.0, 3.0), ("192.0.2.7:5201", 8, 12.0, 3.0)]
    assert "streams" in capsys.readouterr().out


def test_probe_error_is_one_line_on_stderr_and_exit_1(fake, capsys):
    fake.fail_with = NothingListening("nothing listening at 192.0.2.7:5201")
    args = parse("192.0.2.7")
    assert args.handler(args) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines()[-1] == "tame probe: nothing listening at 192.0.2.7:5201"


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["192.0.2.7:0"], "1 to 65535"),
        (["192.0.2.7:x"], "must be a number"),
        (["::1"], "brackets"),
        (["192.0.2.7", "--levels", "1,0"], "not a positive integer"),
        (["192.0.2.7", "--levels", "1,ten"], "not a positive integer"),
        (["192.0.2.7", "--levels", "10,1,10"], "given twice"),
        (["192.0.2.7", "--levels", "1,500"], "more than iperf3 allows"),
        (["192.0.2.7", "--duration", "0"], "--duration"),
        (["192.0.2.7", "--omit", "-1"], "--omit"),
        (["192.0.2.7", "--duration", "30", "--max-duration", "20"], "shorter than --duration"),
        (["192.0.2.7", "--repeats", "0"], "--repeats"),
        # Were taken: --omit 5000 made each probe about 5000 s; the others OverflowError tracebacks.
        (["192.0.2.7", "--omit", "5000"], "--omit '5000': give a number of seconds from 0 to 60"),
        (["192.0.2.7", "--omit", "1e9"], "--omit '1e9': give a number of seconds from 0 to 60"),
        (["192.0.2.7", "--duration", "1e9", "--max-duration", "1e9"], "--duration '1e9': .* from 1 to 300"),
        (["192.0.2.7", "--max-duration", "1e9"], "--max-duration '1e9': .* from 1 to 600"),
        (["192.0.2.7", "--repeats", "99999999999999999999"], "--repeats .*: give a whole number from 1 to 10"),
        (["192.0.2.7", "--repeats", "11"], "from 1 to 10"),
        # Were read as numbers by float(): other scripts' digits and underscores.
        (["192.0.2.7", "--omit", "\uff15"], "--omit"),
        (["192.0.2.7", "--duration", "1_0"], "--duration"),
        (["192.0.2.7", "--levels", "1,\uff11\uff10"], "not a positive integer"),
        (["192.0.2.7", "--repeats", "\uff12"], "--repeats"),
    ],
)
def test_bad_input_raises_usage_error_saying_what_to_fix(fake, argv, hint):
    args = parse(*argv)
    with pytest.raises(UsageError, match=hint):
        args.handler(args)
    assert fake.calls == []


def test_idle_streams_are_said_on_stderr_and_the_kept_probe_shows_its_streams(monkeypatch, capsys):
    # Three of the 10-stream probe's streams carry nothing on its first attempt, none on the next.
    driver = FakeDriver(lambda n: 30e6 * n / (1 + 0.2 * n), rtt_s=0.03, idle_streams_by_attempt={0: 3})
    monkeypatch.setattr(probe, "IperfDriver", lambda congestion_control=None: driver)
    args = parse("192.0.2.7:5300", "--levels", "1,10", "--duration", "10", "--json")
    assert args.handler(args) == 0
    out, err = capsys.readouterr()
    assert "[2/2] 10 stream(s): 3 stream(s) carried nothing, again later for 10 s" in err
    doc = json.loads(out)
    assert [p["idle_streams"] for p in doc["probes"]] == [0, 0]
    assert len(doc["probes"][1]["stream_bps"]) == 10 and min(doc["probes"][1]["stream_bps"]) > 0


def test_model_option_adds_the_models_adaptive_probe_as_advise_does(fake, capsys):
    # auto's third probe goes to min(n_max, 4 x the highest level): 4 x 10 = 40 with the default n_max (64),
    # 24 with --n-max 24; without --model only the levels are probed.
    for argv, expected in ((["--model", "auto"], [1, 10, 40]), (["--model", "auto", "--n-max", "24"], [1, 10, 24]),
                           ([], [1, 10]), (["--model", "lu"], [1, 10])):
        fake.calls.clear()
        args = parse("192.0.2.7:5300", "--levels", "1,10", "--duration", "10", "--json", *argv)
        assert args.handler(args) == 0
        out, err = capsys.readouterr()
        assert [p["streams"] for p in json.loads(out)["probes"]] == expected
        assert [c[2] for c in fake.calls if c[0] == "run"] == expected


def test_json_document_reads_back_into_what_the_models_are_fitted_to(fake, capsys):
    from advisor.plan_runner import level_chooser
    from advisor.tame import point_from_probe

    args = parse("192.0.2.7:5300", "--levels", "1,10", "--duration", "10", "--json", "--model", "auto")
    assert args.handler(args) == 0
    doc = json.loads(capsys.readouterr().out)
    back = probe.from_json(doc)
    assert probe.to_json(back) == doc
    # The same plan run in-process gives the same points the fit would see.
    direct = probe.measure(args, "probe", level_chooser("auto", 64))
    assert [point_from_probe(p) for p in back.probes] == [point_from_probe(p) for p in direct.probes]
    assert back.idle_rtt_s == direct.idle_rtt_s == 0.03
    assert all(len(p["interval_bps"]) > 0 and p["interval_side"] == "receiver" for p in doc["probes"])
    # A document from before the series was kept (benchmarks/results/testbed.json) still reads back.
    older = {**doc, "probes": [{k: v for k, v in p.items() if k not in ("interval_bps", "interval_side")}
                               for p in doc["probes"]]}
    assert [p.interval_bps for p in probe.from_json(older).probes] == [(), (), ()]
    # Each stream's retransmissions are kept beside its rate; a document from before they were kept reads back without.
    assert [len(p["stream_retransmits"]) for p in doc["probes"]] == [len(p["stream_bps"]) for p in doc["probes"]]
    before = {**doc, "probes": [{k: v for k, v in p.items() if k != "stream_retransmits"} for p in doc["probes"]]}
    assert [p.stream_retransmits for p in probe.from_json(before).probes] == [(), (), ()]
    with pytest.raises(KeyError):
        probe.from_json({**doc, "probes": [{k: v for k, v in doc["probes"][0].items() if k != "retransmits"}]})


def test_a_probe_judged_by_the_sender_s_series_says_so(monkeypatch, capsys):
    # Without the server's report the iperf3 parser falls back to the sender's series (interval_side "sender").
    fake = FakeDriver(lambda n: 30e6 * n / (1 + 0.2 * n), rtt_s=0.03)

    class SenderSeriesDriver:
        def run(self, *args, **kwargs):
            return dataclasses.replace(fake.run(*args, **kwargs), interval_side="sender")

        def idle_rtt(self, *args, **kwargs):
            return fake.idle_rtt(*args, **kwargs)

    monkeypatch.setattr(probe, "IperfDriver", lambda congestion_control=None: SenderSeriesDriver())
    args = parse("192.0.2.7:5300", "--levels", "1,10", "--duration", "10", "--json")
    assert args.handler(args) == 0
    out, err = capsys.readouterr()
    done = [line for line in err.splitlines() if "Mbit/s" in line]
    assert len(done) == 2 and all("judged by the sender's series" in line for line in done)
    assert [p["interval_side"] for p in json.loads(out)["probes"]] == ["sender", "sender"]


def test_a_probe_judged_by_the_receiver_s_series_says_nothing_of_it(fake, capsys):
    args = parse("192.0.2.7:5300", "--levels", "1,10", "--duration", "10")
    assert args.handler(args) == 0
    assert "sender's series" not in capsys.readouterr().err
