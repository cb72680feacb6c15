"""`tame serve` as a process: start-up refusals, the port it says it listens on, memory under a huge unauthenticated POST."""

import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from advisor.db import redact_url
from advisor.errors import ConfigError
from advisor.settings import Settings
from tests.advisor.test_db import UNREACHABLE
from tests.api.conftest import free_port, wait_for

TAME = str(Path(sys.executable).with_name("tame"))


def run_serve(tmp_path, *args, env=None, timeout_s=60):
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/t.sqlite3", **(env or {})}
    return subprocess.run([TAME, "serve", "--no-worker", *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def rss_bytes(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_read_token_without_a_write_token_is_refused():
    with pytest.raises(ConfigError, match="TAME_READ_TOKEN.*TAME_TOKEN"):
        Settings.from_env({"TAME_READ_TOKEN": "r", "TAME_TOKEN": ""})
    assert Settings.from_env({"TAME_READ_TOKEN": "r", "TAME_TOKEN": "w"}).read_token == "r"


def test_serve_exits_2_on_a_read_token_without_a_write_token(tmp_path):
    done = run_serve(tmp_path, "--port", str(free_port()), env={"TAME_READ_TOKEN": "r", "TAME_TOKEN": ""})
    assert done.returncode == 2, done
    assert "TAME_READ_TOKEN is set but TAME_TOKEN is empty" in done.stderr
    assert "listening" not in done.stdout


# Site tokens as an operator would make them (`openssl rand -hex 32` is 64 characters; 16 is the least taken).
T1, T2, T3 = "1" * 32, "2" * 32, "3" * 32
# TAME_TOKEN and TAME_READ_TOKEN keep their old rules (any length): deployments already run with short ones.
OPERATOR = {"TAME_TOKEN": "w", "TAME_READ_TOKEN": "r"}


def test_site_tokens_are_read_as_site_token_pairs(tmp_path):
    # Sites are canonicalised as check_site does (lowercase); spaces around pairs and a trailing comma are let pass;
    # a site may have two tokens (one replacing the other); a token may hold a colon.
    assert Settings.from_env({**OPERATOR, "TAME_SITE_TOKENS": f" Site-A:{T1}, site-b:t:{T2},site-a:{T3},"}
                             ).site_tokens == (("site-a", T1), ("site-b", f"t:{T2}"), ("site-a", T3))
    tokens = tmp_path / "site-tokens"
    tokens.write_text(f"site-a:{T1}\n\nsite-b:{T2}\n")
    tokens.chmod(0o600)
    assert Settings.from_env({**OPERATOR, "TAME_SITE_TOKENS_FILE": str(tokens)}).site_tokens == (
        ("site-a", T1), ("site-b", T2))
    assert Settings.from_env(OPERATOR).site_tokens == ()


@pytest.mark.parametrize("value, says", [
    ("site-a", "pair 1 is not SITE:TOKEN; write SITE:TOKEN pairs separated by commas, e.g. site-a:TOKEN1"),
    (f"site-a:{T1},:{T2}", "pair 2 is not SITE:TOKEN"),
    (f"site a:{T1}", "pair 1's site is not a site name (letters, digits, '.', '_' and '-'"),
    (f"-a:{T1}", "pair 1's site is not a site name"),
    ("site-a:", "pair 1's token is empty"),
    (f"site-a:{T1} 1", "pair 1's token is not one word"),
    (f"site-a:{T1}\u00e9", "pair 1's token is not one word; a token is printable ASCII"),
    (f"site-a:{T1},site-b:{T1}", "pairs 1 and 2 have the same token; give each site its own"),
    (f"site-a:{T1},site-a:{T1}", "pair 2 gives pair 1's site and token again"),
    ("site-a:" + "x" * 15, "pair 1's token has fewer than 16 characters"),
    (",", "gives no SITE:TOKEN pair"),
])
def test_a_bad_site_token_value_is_refused_saying_what_to_write(value, says):
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({**OPERATOR, "TAME_SITE_TOKENS": value})
    assert str(raised.value).startswith("TAME_SITE_TOKENS") and says in str(raised.value), raised.value
    # The message names pairs by number, never a token.
    assert T1 not in str(raised.value)


@pytest.mark.parametrize("env, says", [
    ({"TAME_TOKEN": T1}, "pair 1's token is TAME_TOKEN's, which writes for every site"),
    ({"TAME_TOKEN": "w", "TAME_READ_TOKEN": T1}, "pair 1's token is TAME_READ_TOKEN's"),
])
def test_a_site_token_equal_to_the_operator_s_is_refused(env, says):
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({**env, "TAME_SITE_TOKENS": f"site-a:{T1}"})
    assert str(raised.value).startswith("TAME_SITE_TOKENS: ") and says in str(raised.value), raised.value
    assert T1 not in str(raised.value)


# A pair written the wrong way round, or a secret with characters a site name cannot have, must not be echoed:
# what stands in either position may be the secret (docs/security.md).
TOKEN_FIRST = "0123456789abcdef0123456789abcdef:site-a"
GIVEN_ECHO_CASES = [
    ({}, TOKEN_FIRST, "pair 1's token has fewer than 16 characters; make one with `openssl rand -hex 32`"),
    ({}, "Zm9vYmFyYmF6cXV4+/secretpart==:site-a", "pair 1's site is not a site name"),
    # A token that is a site's name (its own pair's, another's or the service's) is a guess away.
    ({}, "dtn1.example.org:dtn2.example.org,dtn2.example.org:DTN1.EXAMPLE.ORG",
     "pair 1's token is the name of a site (pair 2's)"),
    ({"TAME_SITE": "central-0123456789"}, "site-a:central-0123456789",
     "pair 1's token is the name of a site (TAME_SITE)"),
]


@pytest.mark.parametrize("extra, value, says", GIVEN_ECHO_CASES)
def test_a_refused_site_token_pair_is_never_repeated(extra, value, says):
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({**OPERATOR, **extra, "TAME_SITE_TOKENS": value})
    message = str(raised.value)
    assert says in message, message
    for pair in value.split(","):
        for given in pair.split(":", 1):
            assert given.lower() not in message.lower(), (given, message)


def test_settings_repr_shows_no_token_and_no_database_password():
    # A repr ends up in logs, tracebacks and debuggers: it must not carry a secret.
    env = {"TAME_TOKEN": "operator-" + T2, "TAME_READ_TOKEN": "reader-" + T3, "TAME_SITE_TOKENS": f"site-a:{T1}",
           "TAME_DATABASE_URL": "postgresql://tame:pg-s3cret@db:5432/tame?password=pg-other"}
    settings = Settings.from_env(env)
    text = repr(settings)
    assert text.startswith("Settings(") and "ttl_s=3600.0" in text
    assert "database_url='postgresql://tame:***@db:5432/tame?password=***'" in text, text
    for secret in (T1, T2, T3, "pg-s3cret", "pg-other"):
        assert secret not in text, text
    assert settings.database_url == env["TAME_DATABASE_URL"]  # the URL itself is kept whole, to connect with


def test_a_database_url_of_another_kind_is_refused_without_its_password():
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"TAME_DATABASE_URL": "mysql://tame:pg-s3cret@db/tame"})
    assert str(raised.value).startswith("TAME_DATABASE_URL='mysql://tame:***@db/tame': use sqlite:///PATH or "
                                        "postgresql://"), raised.value
    assert "pg-s3cret" not in str(raised.value)


@pytest.mark.parametrize("url, secrets, says", UNREACHABLE)
def test_serve_exits_2_on_a_database_it_cannot_open_without_printing_its_password(tmp_path, url, secrets, says):
    done = run_serve(tmp_path, "--port", str(free_port()), env={"TAME_DATABASE_URL": url})
    assert done.returncode == 2, done
    assert f"tame serve: cannot open the advice store {redact_url(url)}: " in done.stderr and says in done.stderr
    assert "Traceback" not in done.stderr and "listening" not in done.stdout, done.stderr
    for secret in secrets:
        assert secret not in done.stdout + done.stderr, (secret, done.stderr)


def test_site_tokens_need_a_token_for_every_site_and_one_source(tmp_path):
    with pytest.raises(ConfigError, match="TAME_SITE_TOKENS is set but TAME_TOKEN is empty"):
        Settings.from_env({"TAME_SITE_TOKENS": "site-a:t1"})
    with pytest.raises(ConfigError, match="both set"):
        Settings.from_env({"TAME_TOKEN": "w", "TAME_SITE_TOKENS": "site-a:t1", "TAME_SITE_TOKENS_FILE": "/x"})
    with pytest.raises(ConfigError, match="TAME_SITE_TOKENS_FILE=.* cannot be read"):
        Settings.from_env({"TAME_TOKEN": "w", "TAME_SITE_TOKENS_FILE": str(tmp_path / "missing")})


def site_tokens_file(tmp_path, mode, name="site-tokens"):
    """A file of site tokens as an operator writes it, with ``mode``."""
    path = tmp_path / name
    path.write_text(f"site-a:{T1}\nsite-b:{T2}\n")
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_a_site_tokens_file_only_its_owner_may_use_is_read(tmp_path, mode):
    path = site_tokens_file(tmp_path, mode)
    assert Settings.from_env({**OPERATOR, "TAME_SITE_TOKENS_FILE": str(path)}).site_tokens == (
        ("site-a", T1), ("site-b", T2))


# The tests run as root, who may read any file: what is checked is the mode's bits, not whether this user can read.
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606, 0o620, 0o602, 0o610, 0o601, 0o777])
def test_a_site_tokens_file_group_or_others_may_use_is_refused(tmp_path, mode):
    path = site_tokens_file(tmp_path, mode, name="site tokens")  # a space: the chmod line must still work pasted
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({**OPERATOR, "TAME_SITE_TOKENS_FILE": str(path)})
    message = str(raised.value)
    assert message.startswith(f"TAME_SITE_TOKENS_FILE={str(path)!r} is open to group or others (mode {mode:04o})")
    assert message.endswith(f"chmod 600 '{path}', owned by the service's user"), message
    assert T1 not in message and T2 not in message


def test_a_site_tokens_file_is_checked_where_a_link_points(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(site_tokens_file(tmp_path, 0o644))
    with pytest.raises(ConfigError, match="is open to group or others"):
        Settings.from_env({**OPERATOR, "TAME_SITE_TOKENS_FILE": str(link)})
    (tmp_path / "site-tokens").chmod(0o600)
    assert len(Settings.from_env({**OPERATOR, "TAME_SITE_TOKENS_FILE": str(link)}).site_tokens) == 2


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
def test_a_site_tokens_file_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    path = tmp_path / kind
    if kind == "directory":
        path.mkdir(mode=0o700)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)  # nothing ever writes to it: reading it would wait for ever
    else:
        path = Path("/dev/null")
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({**OPERATOR, "TAME_SITE_TOKENS_FILE": str(path)})
    assert str(raised.value) == (f"TAME_SITE_TOKENS_FILE={str(path)!r} is not a regular file; point "
                                 "TAME_SITE_TOKENS_FILE at a file that holds the secrets")


def test_a_site_tokens_file_another_user_owns_is_refused(tmp_path):
    # Mode 600 but another user's: that user could write tokens in. (The tests run as root, who may chown.)
    path = site_tokens_file(tmp_path, 0o600)
    os.chown(path, 4242, -1)
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({**OPERATOR, "TAME_SITE_TOKENS_FILE": str(path)})
    assert str(raised.value) == (f"TAME_SITE_TOKENS_FILE={str(path)!r} belongs to user id 4242, not to the service's "
                                 f"({os.geteuid()}), and it holds secrets: chown {os.geteuid()} {path}")


def test_a_site_tokens_file_too_large_is_refused_without_reading_it_all(tmp_path):
    path = tmp_path / "site-tokens"
    with open(path, "wb") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse: reading it whole would take the memory
    path.chmod(0o600)
    with pytest.raises(ConfigError, match=r"is larger than 1048576 bytes"):
        Settings.from_env({**OPERATOR, "TAME_SITE_TOKENS_FILE": str(path)})


def test_a_site_tokens_file_that_is_not_text_is_refused_without_quoting_it(tmp_path):
    path = tmp_path / "site-tokens"
    path.write_bytes(b"site-a:" + T1.encode() + b"\xff\xfe")
    path.chmod(0o600)
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({**OPERATOR, "TAME_SITE_TOKENS_FILE": str(path)})
    assert str(raised.value) == f"TAME_SITE_TOKENS_FILE={str(path)!r} is not UTF-8 text"


def test_serve_exits_2_on_a_site_tokens_file_others_may_read(tmp_path):
    path = site_tokens_file(tmp_path, 0o644)
    done = run_serve(tmp_path, "--port", str(free_port()), env={"TAME_TOKEN": "w", "TAME_SITE_TOKENS_FILE": str(path)})
    assert done.returncode == 2, done
    assert f"TAME_SITE_TOKENS_FILE={str(path)!r} is open to group or others (mode 0644)" in done.stderr
    assert f"chmod 600 {path}" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "listening" not in done.stdout and T1 not in done.stderr
    assert not (tmp_path / "t.sqlite3").exists()  # refused before the store was opened


@pytest.mark.parametrize("env, says", [
    ({"TAME_TOKEN": T1, "TAME_SITE_TOKENS": f"site-a:{T1}"}, "TAME_SITE_TOKENS: pair 1's token is TAME_TOKEN's"),
    ({"TAME_TOKEN": "", "TAME_SITE_TOKENS": f"site-a:{T1}"}, "TAME_SITE_TOKENS is set but TAME_TOKEN is empty"),
    ({"TAME_TOKEN": "w", "TAME_SITE_TOKENS": f"site-a={T1}"}, "write SITE:TOKEN pairs"),
    ({"TAME_TOKEN": "w", "TAME_SITE_TOKENS": TOKEN_FIRST}, "pair 1's token has fewer than 16 characters"),
])
def test_serve_exits_2_on_bad_site_tokens(tmp_path, env, says):
    done = run_serve(tmp_path, "--port", str(free_port()), env=env)
    assert done.returncode == 2, done
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "listening" not in done.stdout
    assert not (tmp_path / "t.sqlite3").exists()  # refused before the store was opened
    assert T1 not in done.stderr and "0123456789abcdef" not in done.stderr


@pytest.mark.parametrize("port", ["99999", "0", "-1", "http"])
def test_serve_refuses_a_port_outside_1_to_65535(tmp_path, port):
    done = run_serve(tmp_path, "--port", port)
    assert done.returncode == 2, done
    assert "--port" in done.stderr and "1-65535" in done.stderr
    assert "listening" not in done.stdout


def test_serve_on_a_port_in_use_fails_without_saying_it_listens(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_serve(tmp_path, "--port", str(port))
    assert done.returncode != 0, done
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "in use" in done.stderr
    assert "listening" not in done.stdout


@pytest.fixture
def served(tmp_path):
    """A `tame serve` process with TAME_TOKEN set: (process, port), its "listening" line already printed."""
    port = free_port()
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/t.sqlite3", "TAME_TOKEN": "s3cret"}
    proc = subprocess.Popen([TAME, "serve", "--no-worker", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert f"listening on http://127.0.0.1:{port}" in line, line
        yield proc, port
    finally:
        proc.terminate()
        proc.wait(30)


def test_serve_listens_on_the_port_it_names(served):
    proc, port = served
    # Said once the socket is bound: a connection is accepted from then on.
    with socket.create_connection(("127.0.0.1", port), timeout=10):
        pass
    wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200,
             what="healthz")


def test_a_300_mb_post_without_a_token_costs_the_server_no_memory(served):
    proc, port = served
    wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200,
             what="healthz")
    before = rss_bytes(proc.pid)
    head = (f"POST /v1/probe-runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {300 * 1024 * 1024}\r\n\r\n").encode()
    chunk = b"x" * 65536
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        started = time.monotonic()
        # Keep sending (at most 64 MB, 20 s) until the answer comes; the server must answer long before.
        while not select.select([sock], [], [], 0)[0]:
            assert sent < 64 * 1024 * 1024 and time.monotonic() - started < 20, "no answer while the body streamed"
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 401"), answer
    assert rss_bytes(proc.pid) - before < 16 * 1024 * 1024


def test_the_server_limits_come_from_the_environment():
    settings = Settings.from_env({"TAME_KEEPALIVE_TIMEOUT_S": "2", "TAME_HEADER_TIMEOUT_S": "3", "TAME_BODY_TIMEOUT_S": "4",
                                  "TAME_MAX_CONNECTIONS": "50", "TAME_BACKLOG": "64"})
    assert (settings.keepalive_timeout_s, settings.header_timeout_s, settings.body_timeout_s,
            settings.max_connections, settings.backlog) == (2.0, 3.0, 4.0, 50, 64)
    for name, text in (("TAME_MAX_CONNECTIONS", "0"), ("TAME_HEADER_TIMEOUT_S", "soon"), ("TAME_BACKLOG", "1e9")):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: text})


@pytest.mark.parametrize("text", [" ", ",", " , ,"])
def test_an_allow_list_that_lists_no_destination_is_refused(text):
    # Was taken as an empty allow-list, silently: every probe refused.
    with pytest.raises(ConfigError, match="^TAME_ALLOWED_DESTINATIONS is set but lists no destination; give CIDR"):
        Settings.from_env({"TAME_ALLOWED_DESTINATIONS": text})


def test_serve_exits_2_naming_a_bad_allow_list_entry(tmp_path):
    done = run_serve(tmp_path, "--port", str(free_port()), env={"TAME_ALLOWED_DESTINATIONS": "10.0.0.0/33,http://x,*"})
    assert done.returncode == 2, done
    assert "TAME_ALLOWED_DESTINATIONS: '10.0.0.0/33'" in done.stderr and "listening" not in done.stdout


@pytest.mark.parametrize("ports, says", [("22-21", "'22-21' is not a port or a range"), ("0", "'0' is not a port"),
                                         ("5201,70000", "'70000'"), ("ssh", "'ssh'"), (",", "lists no port")])
def test_serve_exits_2_naming_a_bad_allowed_port(tmp_path, ports, says):
    done = run_serve(tmp_path, "--port", str(free_port()), env={"TAME_ALLOWED_PORTS": ports})
    assert done.returncode == 2, done
    assert "TAME_ALLOWED_PORTS" in done.stderr and says in done.stderr and "listening" not in done.stdout


@pytest.mark.parametrize("value, says", [("1 day", "is not a number"), ("60", "at least TAME_TTL_S")])
def test_serve_exits_2_naming_a_bad_probe_max_age(tmp_path, value, says):
    done = run_serve(tmp_path, "--port", str(free_port()), env={"TAME_TTL_S": "3600", "TAME_PROBE_MAX_AGE_S": value})
    assert done.returncode == 2, done
    assert "TAME_PROBE_MAX_AGE_S" in done.stderr and says in done.stderr and "Traceback" not in done.stderr
    assert "listening" not in done.stdout


@pytest.mark.parametrize("env, says", [
    ({"TAME_MAX_SITE_PROBES": "100"}, "TAME_MAX_SITE_PROBES='100' must be between 1 and 64"),
    ({"TAME_MAX_SITE_STREAMS": "5"}, "TAME_MAX_SITE_STREAMS='5' is below the probe plan's 10 streams"),
])
def test_serve_exits_2_naming_a_bad_site_ceiling(tmp_path, env, says):
    done = run_serve(tmp_path, "--port", str(free_port()), env={"TAME_PROBE_LEVELS": "1,10", **env})
    assert done.returncode == 2, done
    assert says in done.stderr and "Traceback" not in done.stderr and "listening" not in done.stdout


@pytest.mark.parametrize("control, says", [
    ("vegas_x", "does not offer"),  # a well-formed name this kernel has no module for
    ("tame", "the fractional stream's control"),
    ("BBR; rm -rf /", "as the kernel does"),
    ("c" * 40, "as the kernel does"),
])
def test_serve_exits_2_on_a_congestion_control_it_cannot_probe_under(tmp_path, control, says):
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/t.sqlite3", "TAME_CONGESTION_CONTROL": control}
    # With its probe worker (no --no-worker): the worker would probe under that control.
    done = subprocess.run([TAME, "serve", "--port", str(free_port())], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "t.sqlite3").exists()  # refused before the store was opened


@pytest.mark.parametrize("variable", ["TAME_TOKEN", "TAME_READ_TOKEN"])
@pytest.mark.parametrize("token", ["s3cr3tPW\n", "s3cr3tPW\u00e9", "s3cr 3tPW", "\ts3cr3tPW"])
def test_a_token_a_header_cannot_carry_is_refused_naming_only_its_variable(variable, token):
    # Was accepted: every write then got 401, for ever (no client can send such a header).
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"TAME_TOKEN": "w", variable: token})
    assert str(raised.value).startswith(f"{variable} is not a usable token: a token is printable ASCII without white "
                                        "space"), raised.value
    assert "s3cr" not in str(raised.value)


def test_serve_exits_2_on_a_token_a_header_cannot_carry(tmp_path):
    done = run_serve(tmp_path, "--port", str(free_port()), env={"TAME_TOKEN": "s3cr3tPW\n"})
    assert done.returncode == 2 and "TAME_TOKEN is not a usable token" in done.stderr, done
    assert "s3cr" not in done.stdout + done.stderr and "listening" not in done.stdout
    assert not (tmp_path / "t.sqlite3").exists()


@pytest.mark.parametrize("host, says", [
    # Was: "" listened on every interface (0.0.0.0) and printed "listening on http://:PORT"; multicast was taken.
    ("", "'' names no address; give 0.0.0.0 to listen on every interface"),
    ("224.0.0.1", "'224.0.0.1' is a multicast address"),
    ("ff02::1", "'ff02::1' is a multicast address"),
])
def test_serve_refuses_a_host_it_should_not_listen_on(tmp_path, host, says):
    done = run_serve(tmp_path, "--host", host, "--port", str(free_port()))
    assert done.returncode == 2 and done.stderr.startswith("tame serve: argument --host: ") and says in done.stderr, done
    assert "Traceback" not in done.stderr and "listening" not in done.stdout
    assert not (tmp_path / "t.sqlite3").exists()


def test_serve_on_ipv6_prints_a_url_with_the_address_in_brackets(tmp_path):
    # Was "listening on http://::1:PORT", which is no URL.
    port = free_port()
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/t.sqlite3"}
    proc = subprocess.Popen([TAME, "serve", "--no-worker", "--host", "::1", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert f"listening on http://[::1]:{port} " in line, (line, proc.stderr.read() if proc.poll() else "")
        assert httpx.get(f"http://[::1]:{port}/healthz", timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)



@pytest.mark.parametrize("url, says", [("sqlite:///", "names no file"), ("sqlite:///:memory:", "names no file"),
                                       ("sqlite:///{tmp}/a.db?mode=ro", "holds '?'")])
def test_serve_exits_2_on_a_sqlite_url_that_names_no_one_file(tmp_path, url, says):
    # Was: served, each pooled connection with its own empty database ("no such table: current_fits" 503s), or a file
    # named "a.db?mode=ro".
    done = run_serve(tmp_path, "--port", str(free_port()), env={"TAME_DATABASE_URL": url.format(tmp=tmp_path)})
    assert done.returncode == 2 and f"tame serve: TAME_DATABASE_URL='{url.format(tmp=tmp_path)}' {says}" \
        in done.stderr, done
    assert "Traceback" not in done.stderr and "listening" not in done.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["postgres://", "postgresql://tame@/tame", "postgresql://tame@db:5432"])
def test_paths_exits_2_on_a_postgresql_url_that_leaves_host_or_database_to_libpq(monkeypatch, capsys, url):
    # In-process, with connecting forbidden: a bare postgres:// reaches this machine's server as the OS user.
    import psycopg

    from advisor.cli import main

    monkeypatch.setattr(psycopg, "connect", lambda *a, **k: pytest.fail(f"{url} was connected to"))
    monkeypatch.setenv("TAME_DATABASE_URL", url)
    assert main(["paths"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"tame paths: TAME_DATABASE_URL={url!r} names no ") and "libpq" in err and out == "", err
