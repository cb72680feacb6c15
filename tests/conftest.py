import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import pytest

from probes.lifetime import signal_on_parent_death
from tests.sites import SITE

# Every service a test starts (in process or as `tame serve`) speaks for this site unless the test says otherwise.
os.environ["TAME_SITE"] = SITE


def pytest_collection_modifyitems(config, items):
    # Tests marked netns need root. In CI (CI=true, root) they must fail loudly, never skip.
    if os.geteuid() == 0 or os.environ.get("CI"):
        return
    skip = pytest.mark.skip(reason="needs root for network namespaces")
    for item in items:
        if "netns" in item.keywords:
            item.add_marker(skip)


# -- PostgreSQL -----------------------------------------------------------------------------
#
# Tests marked `postgres` run against a throwaway cluster the session starts itself (Debian's
# server binaries, /usr/lib/postgresql/*/bin), or against the server TAME_TEST_DATABASE_URL names.
# Each test gets a database of its own, created empty and dropped afterwards. Without binaries
# the tests skip, except in CI (CI=true), where they fail.

TEST_DATABASE_URL_ENV = "TAME_TEST_DATABASE_URL"


def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _postgres_bindir() -> str | None:
    """The bin directory of the newest Debian PostgreSQL server package installed, or None."""
    found = glob.glob("/usr/lib/postgresql/*/bin/postgres")
    if not found:
        return None
    newest = max(found, key=lambda path: [int(p) for p in path.split("/")[4].split(".") if p.isdigit()])
    return os.path.dirname(newest)


def _die_with_parent():
    # The postmaster quits (SIGQUIT: immediate shutdown, children included) if pytest dies without
    # its teardown, so no cluster outlives the session that started it.
    signal_on_parent_death(signal.SIGQUIT)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, port: int, timeout_s: float = 60.0) -> bool:
    import psycopg

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=2).close()
            return True
        except psycopg.OperationalError:
            time.sleep(0.1)
    return False


@contextmanager
def throwaway_cluster():
    """A PostgreSQL cluster in a temporary directory on a free 127.0.0.1 port: yields its postgresql:// URL.

    As root (CI) initdb and the server run as the `postgres` system user, since both refuse root;
    otherwise as the current user. The server is a child of this process (not daemonised by
    pg_ctl) and dies with it; on exit it is shut down and its directory removed.
    """
    bindir = _postgres_bindir()
    if bindir is None:
        _unavailable("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin; Debian package `postgresql`)")
    as_user = {}
    if os.geteuid() == 0:
        try:
            pg = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("running as root and there is no `postgres` system user to run the cluster as")
        as_user = {"user": pg.pw_uid, "group": pg.pw_gid, "extra_groups": []}
    root = tempfile.mkdtemp(prefix="tame-pg-")
    proc = None
    try:
        if as_user:
            os.chown(root, as_user["user"], as_user["group"])
        data = os.path.join(root, "data")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "HOME": root}
        init = subprocess.run(
            [os.path.join(bindir, "initdb"), "-D", data, "--username=postgres", "--auth=trust",
             "--encoding=UTF8", "--locale=C", "--no-sync"],
            capture_output=True, text=True, timeout=120, env=env, cwd=root, **as_user)
        if init.returncode != 0:
            _unavailable(f"initdb failed: {init.stderr.strip()[-500:]}")
        log_path = os.path.join(root, "server.log")
        for _ in range(3):  # another process may take the free port between our check and the bind
            port = _free_port()
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    [os.path.join(bindir, "postgres"), "-D", data, "-p", str(port),
                     "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={root}",
                     "-c", "max_connections=300", "-c", "fsync=off", "-c", "synchronous_commit=off",
                     "-c", "full_page_writes=off"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
                    preexec_fn=_die_with_parent, **as_user)
            if _wait_ready(proc, port):
                break
            _stop(proc)
            proc = None
        if proc is None:
            with open(log_path, encoding="utf-8", errors="replace") as log:
                _unavailable(f"the throwaway PostgreSQL server did not start: {log.read()[-1000:]}")
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    """Fast shutdown (SIGINT), then SIGKILL if it lingers; always reaped."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def postgres_server():
    """A postgresql:// URL of a database on a server whose user may CREATE DATABASE."""
    explicit = os.environ.get(TEST_DATABASE_URL_ENV)
    if explicit:
        yield explicit
        return
    with throwaway_cluster() as url:
        yield url


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture
def pg_url(postgres_server):
    """A fresh, empty PostgreSQL database for one test, dropped (its connections ended) afterwards."""
    import psycopg

    name = f"tame_test_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(postgres_server, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE template0")
    except psycopg.OperationalError as exc:
        if os.environ.get(TEST_DATABASE_URL_ENV):
            pytest.fail(f"{TEST_DATABASE_URL_ENV}: cannot create a test database there: {exc}", pytrace=False)
        _unavailable(f"cannot create a test database on the throwaway server: {exc}")
    try:
        yield _with_database(postgres_server, name)
    finally:
        with psycopg.connect(postgres_server, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
