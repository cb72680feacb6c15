"""Real processes for tests: `iperf3 -s` and `tame serve` on 127.0.0.1, their output in files."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from tests.api.conftest import free_port, wait_for

TAME = str(Path(sys.executable).with_name("tame"))
TOKEN_VARIABLES = ("TAME_TOKEN", "TAME_READ_TOKEN", "TAME_SITE_TOKENS")


def start_iperf3(tmp_path, port):
    assert shutil.which("iperf3"), "iperf3 is not installed"
    log = tmp_path / "iperf3.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["iperf3", "-s", "-B", "127.0.0.1", "-p", str(port), "--forceflush"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    wait_for(lambda: "Server listening" in log.read_text(errors="replace") or proc.poll() is not None,
             timeout_s=30, what="iperf3 -s")
    assert proc.poll() is None, log.read_text(errors="replace")
    return proc


def start_serve(tmp_path, db_path, env=None, args=(), port=None, cgroup=None):
    """`tame serve` on ``port`` (else a free one) over ``db_path``, in the cgroup whose folder is ``cgroup`` from its
    first instruction (else this process's): (Popen, base URL); its output goes to files in tmp_path."""
    port = port or free_port()
    # Tokens only as the test gives them, never from the environment the tests run in.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(TOKEN_VARIABLES)}
    env = {**inherited, "TAME_DATABASE_URL": f"sqlite:///{db_path}", **(env or {})}
    out = (tmp_path / f"serve-{port}.out").open("ab")
    err = (tmp_path / f"serve-{port}.err").open("ab")
    command = [TAME, "serve", "--port", str(port), *args]
    if cgroup is not None:  # writing 0 to cgroup.procs moves the writer: the shell, then what it becomes
        command = ["sh", "-ec", 'echo 0 > "$0"; exec "$@"', str(cgroup / "cgroup.procs"), *command]
    try:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    finally:
        out.close()
        err.close()
    base = f"http://127.0.0.1:{port}"

    def up():
        assert proc.poll() is None, (tmp_path / f"serve-{port}.err").read_text(errors="replace")
        try:
            return httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout_s=60, what="tame serve")
    except BaseException:
        stop(proc)
        raise
    return proc, base


def stop(*procs):
    """Stop each process (None: not started): SIGTERM, SIGKILL after 30 s."""
    for proc in procs:
        if proc is None:
            continue
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait(30)
