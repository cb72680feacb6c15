"""Every command that talks to the advice service refuses a bad or hostile service URL (TAME_URL, --server) with exit
status 2 and one line naming where it came from, before any process runs or anything is stored; no message shows
the URL's password. (check_url itself: tests/api/test_client.py.)"""

import os
import subprocess

import pytest

from advisor.cli import main

# Each holds the password s3cr3tPW, as is, percent-encoded or cut by a raw /: none of its pieces may be printed.
SECRET_PIECES = ("s3cr", "tPW")
HOSTILE = [
    ("http://u:s3cr3tPW@[::1", "is not a valid URL"),
    ("http://u:s3cr/3tPW@h", "is not a valid URL"),
    ("ftp://u:s3cr3tPW@h/", "is not an http or https URL"),
    ("u:s3cr3tPW@h:8000", "is not an http or https URL"),
    ("http://u:s3cr%33tPW@", "has no host"),
    ("http://u:s3cr3tPW@127.0.0.1:1", "holds a login, and the service takes none"),
    # A login alone may be the secret: it was shown whole.
    ("http://s3cr3tPW@127.0.0.1:1", "holds a login, and the service takes none"),
    # Host names the socket layer's idna codec refuses: were a UnicodeError traceback (IDNAError for xn--zz).
    ("http://u:s3cr3tPW@" + "a" * 64 + ":8000", "has a host name with an empty label or one over 63 characters"),
    ("http://u:s3cr3tPW@a..b:8000", "has a host name with an empty label or one over 63 characters"),
    ("http://u:s3cr3tPW@xn--zz:8000", "is not a valid URL"),
]
# Port 1 on loopback refuses at once.
UNREACHABLE = "http://127.0.0.1:1"

ARGV = {
    "advise": ["advise", "10.0.0.1", "--max-impact", "0.1"],
    "curve": ["curve", "10.0.0.1"],
    "transfer": ["transfer", "10.0.0.1", "--max-impact", "0.1", "--duration", "3"],
    "schedule": ["schedule", "{tmp}/queue"],
    "agent": ["agent", "--dest-file", "{tmp}/dests", "--once"],
}


def _no_processes(*args, **kwargs):
    raise AssertionError(f"a refused URL must not reach a system command: {args}")


@pytest.fixture
def tame(tmp_path, monkeypatch, capsys):
    """run(command, *extra) -> (exit status, stdout, stderr): `tame COMMAND` in-process, with its local store and
    the agent's spool in tmp_path, and no process allowed to start."""
    for name in [name for name in os.environ if name.startswith("TAME_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TAME_DATABASE_URL", f"sqlite:///{tmp_path / 'tame.sqlite3'}")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(subprocess, "Popen", _no_processes)
    (tmp_path / "queue").write_text("dest=10.0.0.1 max_impact=0.1 duration_s=3\n")
    (tmp_path / "dests").write_text("10.0.0.1\n")

    def run(command, *extra):
        try:
            status = main([arg.format(tmp=tmp_path) for arg in ARGV[command]] + list(extra))
        except SystemExit as exc:  # argparse's refusals
            status = exc.code
        out, err = capsys.readouterr()
        return status, out, err

    yield run
    # Nothing stored: not the local store (which a refused TAME_URL must not fall back to), nor a run in the agent's
    # spool (an agent that starts makes its spool directory, checking it can write there).
    assert not (tmp_path / "tame.sqlite3").exists()
    assert not [p for p in (tmp_path / "state").rglob("*") if not p.is_dir()]


def _refused(done, command, *says):
    status, out, err = done
    assert status == 2 and out == "", done
    assert err.startswith(f"tame {command}: ") and err.count("\n") == 1, err
    for text in says:
        assert text in err, err
    for piece in SECRET_PIECES:
        assert piece not in out + err, err


@pytest.mark.parametrize("url, why", HOSTILE)
@pytest.mark.parametrize("command", ["advise", "curve", "transfer", "schedule"])
def test_a_bad_tame_url_is_refused_before_anything_runs(tame, monkeypatch, command, url, why):
    monkeypatch.setenv("TAME_URL", url)
    _refused(tame(command), command, "TAME_URL='", "***", why, "give the advice service's address as http://HOST:PORT")


@pytest.mark.parametrize("url, why", HOSTILE)
@pytest.mark.parametrize("command, flag", [("schedule", "--server"), ("agent", "--server"), ("agent", "--push")])
def test_a_bad_server_flag_is_refused_before_anything_runs(tame, command, flag, url, why):
    _refused(tame(command, flag, url), command, f"{flag} '", "***", why, "http://HOST:PORT")  # named as typed


@pytest.mark.parametrize("command", ["advise", "curve", "transfer", "schedule"])
def test_an_unreachable_service_is_named(tame, monkeypatch, command):
    monkeypatch.setenv("TAME_URL", UNREACHABLE)
    _refused(tame(command), command, f"{UNREACHABLE}: ", "cannot reach the advice service")


@pytest.mark.parametrize("command", ["advise", "curve", "transfer", "schedule"])
def test_an_unreachable_service_is_named_without_its_query_values(tame, monkeypatch, command):
    # Was shown whole: http://127.0.0.1:1/?token=s3cr3tPW.
    monkeypatch.setenv("TAME_URL", f"{UNREACHABLE}/?token=s3cr3tPW")
    _refused(tame(command), command, f"{UNREACHABLE}/?token=***: ", "cannot reach the advice service")


def test_schedule_names_an_unreachable_server_flag(tame):
    _refused(tame("schedule", "--server", UNREACHABLE), "schedule", f"{UNREACHABLE}: ")


def test_an_agent_keeps_going_when_its_server_is_unreachable(tame, tmp_path):
    # An unreachable service is the agent's everyday weather (it spools and retries), not bad input: exit 0.
    (tmp_path / "dests").write_text("")  # nothing to probe
    status, out, err = tame("agent", "--server", UNREACHABLE)
    assert status == 0 and "cannot reach the advice service" in err, (status, out, err)
    for piece in SECRET_PIECES:
        assert piece not in out + err


# Tokens a header cannot carry (advisor.limits.check_token): each holds the secret s3cr3tPW, never to be printed.
BAD_TOKENS = ["s3cr3tPW\n", "s3cr3tPW\u00e9", "s3cr 3tPW", "s3cr3tPW\x7f"]


@pytest.mark.parametrize("token", BAD_TOKENS)
@pytest.mark.parametrize("variable", ["TAME_TOKEN", "TAME_READ_TOKEN"])
@pytest.mark.parametrize("command, extra", [("advise", ()), ("curve", ()), ("transfer", ()), ("schedule", ()),
                                            ("agent", ("--push", UNREACHABLE)), ("agent", ("--server", UNREACHABLE))])
def test_a_token_a_header_cannot_carry_is_refused_naming_its_variable(tame, monkeypatch, command, extra, variable,
                                                                      token):
    # Was: "HTTP 0: cannot reach the advice service: Illegal header value b'Bearer s3cr3tPW\n'" (exit 2, and exit 0
    # from `tame agent --once`, every round), or a UnicodeEncodeError traceback.
    monkeypatch.setenv("TAME_URL", UNREACHABLE)
    monkeypatch.setenv("TAME_TOKEN", "w")
    monkeypatch.setenv(variable, token)
    _refused(tame(command, *extra), command, f"{variable} is not a usable token", "printable ASCII without white space")


def test_the_client_refuses_a_token_a_header_cannot_carry_without_showing_it():
    from api.client import InvalidToken, TameClient

    for token in BAD_TOKENS:
        with pytest.raises(InvalidToken) as raised:
            TameClient(UNREACHABLE, token=token)
        assert "s3cr" not in str(raised.value) and "printable ASCII" in str(raised.value)


@pytest.mark.parametrize("option", [("--model", "lu"), ("--no-margin",), ("--n-max", "5"), ("--omit", "2"),
                                    ("--repeats", "2"), ("--max-duration", "30")])
def test_advise_with_a_service_refuses_the_options_the_service_does_not_take(tame, monkeypatch, option):
    # Was: silently ignored (only --levels and --duration are sent), as `tame curve DEST` never did.
    monkeypatch.setenv("TAME_URL", UNREACHABLE)
    _refused(tame("advise", *option), "advise", f"tame advise: {option[0]}: with TAME_URL the server probes with its "
             "own settings", "leave it out")


def test_advise_with_a_service_takes_levels_and_duration(tame, monkeypatch):
    monkeypatch.setenv("TAME_URL", UNREACHABLE)
    _refused(tame("advise", "--levels", "1,4", "--duration", "3"), "advise", "cannot reach the advice service")
