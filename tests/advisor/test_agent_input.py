"""`tame agent` given bad or hostile input (its options, its --dest-file, its spool): exit 2 with one line naming
the option or file and what to give, or, for a spooled record, the record set aside; never a traceback, a hang or a
busy loop. Real processes: the agent, pointed at a port where nothing listens (nothing here probes)."""

import json
import os
import subprocess

import pytest

from tests.api.conftest import free_port
from tests.api.procs import TAME


def agent(tmp_path, *argv, dests="127.0.0.1:5201\n"):
    """Run `tame agent --dest-file DESTS *argv` (DESTS holding ``dests`` unless argv names another) with a store
    and a default spool in tmp_path, none of them made beforehand."""
    dest_file = tmp_path / "dests"
    dest_file.write_text(dests)
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/never.sqlite3",
           "XDG_STATE_HOME": str(tmp_path / "state"), "TAME_ALLOWED_DESTINATIONS": "127.0.0.0/8"}
    env.pop("TAME_TOKEN", None)
    if "--dest-file" not in argv:
        argv = ("--dest-file", str(dest_file), *argv)
    return subprocess.run([TAME, "agent", *argv], env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def refused(done, tmp_path, *says):
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert all(word in done.stderr for word in says), done.stderr
    assert not (tmp_path / "never.sqlite3").exists()


NOWHERE = "http://127.0.0.1:9"
MODES = {"local": [], "push": ["--push", NOWHERE], "site": ["--site", "dtn1", "--server", NOWHERE]}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("interval", ["-1", "nan", "inf", "1e400", "0", "0.5", "86401", "1_0", "５"])
def test_an_interval_that_is_not_a_sane_number_of_seconds_exits_2(tmp_path, mode, interval):
    """Before: -1 or nan made a pushing agent send thousands of requests a second (a site agent, registrations),
    0 a busy loop, and locally -1/nan a ValueError, inf/1e400 an OverflowError traceback."""
    refused(agent(tmp_path, *MODES[mode], f"--interval={interval}"), tmp_path, "--interval", "1 to 86400")


def test_push_and_server_together_exit_2(tmp_path):
    """Before: the last of the two URLs was used, the other ignored without a word."""
    refused(agent(tmp_path, "--once", "--push", NOWHERE, "--server", "http://127.0.0.1:10"), tmp_path,
            "--push and --server are the same option: give one URL")


def test_a_spool_without_a_service_exits_2(tmp_path):
    """Before: --spool was ignored by an agent that stores its runs itself (no --push or --server)."""
    refused(agent(tmp_path, "--once", "--spool", "/nonexistent/x"), tmp_path, "--spool", "give --push or --server")


@pytest.mark.parametrize("mode", ["push", "site"])
def test_a_spool_that_is_a_file_exits_2(tmp_path, mode):
    (tmp_path / "file").write_text("")
    refused(agent(tmp_path, *MODES[mode], "--spool", str(tmp_path / "file")), tmp_path,
            f"--spool {tmp_path / 'file'} is not a directory")


def test_a_spool_whose_rejected_is_not_a_directory_exits_2(tmp_path):
    """Before: the agent ran, and every record it could not read stayed, 'cannot be set aside (File exists)'."""
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "rejected").write_text("")
    (spool / "1.json").write_text("garbage")
    refused(agent(tmp_path, *MODES["push"], "--spool", str(spool)), tmp_path,
            f"{spool / 'rejected'}", "is not a directory: move it away")
    assert sorted(os.listdir(spool)) == ["1.json", "rejected"]


def _fifo(path):
    os.mkfifo(path)


def _zero(path):
    os.symlink("/dev/zero", path)


def _not_utf8(path):
    path.write_bytes(b"127.0.0.1:5201 # \xff\xfe\n")


def _too_large(path):
    path.write_bytes(b"#" * ((1 << 20) + 1))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("make, says", [(_fifo, "is not a regular file"), (_zero, "is not a regular file"),
                                        (_not_utf8, "is not UTF-8 text"), (_too_large, "is larger than 1048576")])
def test_a_dest_file_that_is_not_a_small_text_file_exits_2(tmp_path, mode, make, says):
    """Before: a FIFO hung the agent (SIGTERM too), /dev/zero was read until MemoryError, a byte that is not
    UTF-8 gave a UnicodeDecodeError traceback."""
    path = tmp_path / "hostile"
    make(path)
    refused(agent(tmp_path, *MODES[mode], "--once", "--dest-file", str(path)), tmp_path,
            f"--dest-file {path} {says}", "give a file of HOST[:PORT] lines")


def test_spooled_records_that_are_not_runs_are_set_aside_and_the_agent_goes_on(tmp_path):
    """A record nested 100,000 deep (before: RecursionError at every start, the record kept), a FIFO (before: the
    agent hung), a link to /dev/zero (before: MemoryError), a file over the cap: each is set aside in
    SPOOL/rejected with a line saying why, and the run after them is tried (kept: nothing listens)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "1-deep.json").write_text("[" * 100_000)
    os.mkfifo(spool / "2-fifo.json")
    os.symlink("/dev/zero", spool / "3-zero.json")
    with open(spool / "4-huge.json", "wb") as fh:
        fh.truncate(64 << 20)  # sparse: over the cap, on no disk
    good = {"form": "tame-agent-spool/1", "idempotency_key": "k-1", "spooled_at": 0,
            "payload": {"dest": "127.0.0.1:5201", "probes": []}}
    (spool / "5-good.json").write_text(json.dumps(good))
    done = agent(tmp_path, "--push", f"http://127.0.0.1:{free_port()}", "--once", "--spool", str(spool), dests="")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    for name, why in [("1-deep", "nested too deeply"), ("2-fifo", "not a regular file"),
                      ("3-zero", "not a regular file"), ("4-huge", "larger than")]:
        assert (f"spooled run {spool / name}.json is unreadable ({why}" in done.stderr
                and f"set aside in {spool / 'rejected' / name}.json" in done.stderr), done.stderr
    assert "127.0.0.1:5201: not delivered" in done.stderr and f"kept in {spool / '5-good.json'}" in done.stderr
    assert sorted(os.listdir(spool)) == ["5-good.json", "rejected"]
    assert sorted(os.listdir(spool / "rejected")) == ["1-deep.json", "2-fifo.json", "3-zero.json", "4-huge.json"]


def test_spooled_records_that_could_not_be_sent_are_set_aside_and_the_agent_goes_on(tmp_path):
    """Records that parse but could not be sent: a payload that is not an object (before: AttributeError at every
    start, the record kept), a NaN in it (before: httpx's ValueError, a traceback), an Idempotency-Key that is not
    ASCII (before: UnicodeEncodeError) or holds a newline (before: 'cannot reach the advice service', kept and sent
    again every round, and every run spooled after it never sent), and a record without a key in a file whose name
    cannot be one. Each is set aside with a line saying why, and the run after them is tried."""
    spool = tmp_path / "spool"
    spool.mkdir()
    form = "tame-agent-spool/1"
    run = {"dest": "127.0.0.1:5201", "probes": []}
    records = {
        "1-text": {"form": form, "payload": "127.0.0.1:5201"},
        "2-list": {"form": form, "payload": [run]},
        "4-key-unicode": {"form": form, "payload": run, "idempotency_key": "cl\u00e9"},
        "5-key-newline": {"form": form, "payload": run, "idempotency_key": "k\nX-Other: 1"},
        "6-key-long": {"form": form, "payload": run, "idempotency_key": "k" * 129},
        "7-\u00e9": {"form": form, "payload": run},
    }
    for name, record in records.items():
        (spool / f"{name}.json").write_text(json.dumps(record))
    (spool / "3-nan.json").write_text('{"form": "%s", "payload": {"dest": "127.0.0.1:5201", "probes": [], '
                                      '"measured_ago_s": NaN}}' % form)
    good = {"form": form, "idempotency_key": "k-1", "spooled_at": 0, "payload": run}
    (spool / "9-good.json").write_text(json.dumps(good))
    done = agent(tmp_path, "--push", f"http://127.0.0.1:{free_port()}", "--once", "--spool", str(spool), dests="")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    set_aside = sorted([*records, "3-nan"])
    for name, why in zip(set_aside, ["its payload", "its payload", "it holds NaN", "Idempotency-Key must be",
                                     "Idempotency-Key must be", "Idempotency-Key must be", "Idempotency-Key must be"]):
        assert (f"spooled run {spool / name}.json is unreadable (" in done.stderr
                and f"set aside in {spool / 'rejected' / name}.json" in done.stderr), done.stderr
        assert why in done.stderr.split(f"spooled run {spool / name}.json is unreadable (")[1].split("\n")[0]
    assert "127.0.0.1:5201: not delivered" in done.stderr and f"kept in {spool / '9-good.json'}" in done.stderr
    assert sorted(os.listdir(spool)) == ["9-good.json", "rejected"]
    assert sorted(os.listdir(spool / "rejected")) == [f"{name}.json" for name in set_aside]
