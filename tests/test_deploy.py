"""docker-compose.yml and the Dockerfile refer to things that exist (no Docker engine runs here)."""

import os
import pwd
import re
import shlex
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from advisor.allowlist import AllowList
from advisor.cli import build_parser
from advisor.commands.agent import read_destinations
from advisor.destinations import parse_destination
from advisor.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_the_api_the_agent_and_an_iperf3_server():
    services = compose()["services"]
    assert {"api", "agent", "iperf3", "postgres"} <= services.keys()
    assert services["postgres"]["profiles"] == ["postgres"]
    assert services["iperf3"]["command"][0] == "iperf3"


def test_compose_tame_commands_parse_with_the_real_cli():
    parser = build_parser()
    for name, service in compose()["services"].items():
        command = service.get("command")
        if command and command[0] == "tame":
            args = parser.parse_args(command[1:])
            assert callable(args.handler), name


def test_compose_files_and_settings_exist():
    services = compose()["services"]
    for service in services.values():
        if service.get("build"):
            assert (ROOT / service["build"] / "Dockerfile").is_file()
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
        for dependency in service.get("depends_on", []):
            assert dependency in services
    env = services["api"]["environment"]
    AllowList.parse(env["TAME_ALLOWED_DESTINATIONS"])  # raises ConfigError if malformed
    assert env["TAME_DATABASE_URL"].startswith("sqlite:///")
    dests = read_destinations(ROOT / "deploy" / "destinations.txt")
    assert dests == ["iperf3:5201"]


def test_dockerfile_copies_every_package_and_runs_tame():
    text = (ROOT / "Dockerfile").read_text()
    for package in ("models", "probes", "advisor", "api"):
        assert f"COPY {package} ./{package}" in text
        assert (ROOT / package).is_dir()
    cmd = next(line for line in text.splitlines() if line.startswith("CMD"))
    argv = yaml.safe_load(cmd[len("CMD"):])
    assert argv[0] == "tame" and build_parser().parse_args(argv[1:]).command == "serve"
    assert shlex.split("iperf3 libiperf0")[0] in text


# -- the image's user -------------------------------------------------------------------------

def dockerfile_instructions():
    """[(INSTRUCTION, arguments)] of the Dockerfile, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        if not current and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        lines.append(current + raw)
        current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else "")
            for line in lines]


def test_the_image_runs_as_its_own_user_that_owns_the_data_volume():
    steps = dockerfile_instructions()
    kinds = [kind for kind, _ in steps]
    users = [args.strip() for kind, args in steps if kind == "USER"]
    assert users, "the image must not run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0", "nobody", "65534"), user
    # The user is made by a RUN before it is used, with a fixed non-zero uid.
    made = [(i, shlex.split(args)) for i, (kind, args) in enumerate(steps) if kind == "RUN" and "useradd" in args]
    assert made, "no RUN useradd"
    at, argv = made[-1]
    useradd = argv[argv.index("useradd"):]
    assert useradd[useradd.index("&&") - 1 if "&&" in useradd else -1] == user
    uid = int(useradd[useradd.index("--uid") + 1])
    assert uid >= 1000, uid
    # /data exists and belongs to that user before VOLUME declares it (a new volume copies its owner).
    volume_at = next(i for i, (kind, args) in enumerate(steps) if kind == "VOLUME" and "/data" in args)
    chowns = [i for i, (kind, args) in enumerate(steps[:volume_at]) if kind == "RUN"
              and any(part.split(":")[0] == user for part in _after(shlex.split(args), "chown"))
              and "/data" in _after(shlex.split(args), "chown")]
    assert chowns and at <= chowns[-1] < volume_at
    assert kinds.index("USER") > volume_at
    env = dict(args.split("=", 1) for kind, args in steps if kind == "ENV")
    assert env["TAME_DATABASE_URL"] == "sqlite:////data/tame.sqlite3"


def _after(argv, word):
    """The arguments of the first ``word`` command in a shell argv (up to the next && or ;)."""
    if word not in argv:
        return []
    rest = argv[argv.index(word) + 1:]
    for end, part in enumerate(rest):
        if part in ("&&", ";", "||"):
            return rest[:end]
    return rest


def as_unprivileged(argv):
    """``argv`` run as nobody when this is root, else as this (already unprivileged) user: (argv, uid).

    The test machine's interpreter lives under /root (mode 0700), so nobody gets
    CAP_DAC_READ_SEARCH to read and search it; that bypasses read checks only, and every write
    (the thing under test) is checked as for any unprivileged user.
    """
    if os.geteuid() != 0:
        return argv, os.geteuid()
    nobody = pwd.getpwnam("nobody")
    assert shutil.which("setpriv"), "setpriv (util-linux) is needed to drop root"
    return ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", *argv], nobody.pw_uid


def start_serve_as(data, uid, tmp_path):
    port = _free_port()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(data),
           "TAME_DATABASE_URL": f"sqlite:///{data}/tame.sqlite3"}
    argv, _ = as_unprivileged([str(Path(sys.executable).with_name("tame")), "serve", "--no-worker",
                               "--port", str(port)])
    err = tmp_path / f"serve-{port}.err"
    with err.open("wb") as stderr:
        proc = subprocess.Popen(argv, env=env, cwd=str(data), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=stderr)
    return proc, f"http://127.0.0.1:{port}", err


def test_serve_as_an_unprivileged_user_writes_its_own_data_dir(tmp_path):
    _, uid = as_unprivileged([])
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, uid, -1)
    tmp_path.chmod(0o755)
    proc, base, err = start_serve_as(data, uid, tmp_path)
    try:
        deadline = time.monotonic() + 60  # a generous bound on start-up
        while True:
            assert proc.poll() is None, err.read_text(errors="replace")
            try:
                health = httpx.get(f"{base}/healthz", timeout=5)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "tame serve did not answer /healthz"
                time.sleep(0.1)
        assert health.status_code == 200 and health.json() == {"status": "ok", "database": "sqlite"}
        posted = httpx.post(f"{base}/v1/observations",
                            json={"dest": "127.0.0.1:5201", "streams": 2, "throughput_bps": 1e8}, timeout=30)
        assert posted.status_code == 202, posted.text
    finally:
        proc.terminate()
        proc.wait(30)
    db = data / "tame.sqlite3"
    assert db.stat().st_uid == uid
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM observations").fetchone()[0] == 1


def test_serve_as_an_unprivileged_user_refuses_a_data_dir_it_cannot_write(tmp_path):
    # The image's former shape: /data owned by root, the server run as another user.
    _, uid = as_unprivileged([])
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o555)
    tmp_path.chmod(0o755)
    proc, _, err = start_serve_as(data, uid, tmp_path)
    try:
        assert proc.wait(60) == 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "cannot open the advice store" in err.read_text(errors="replace")
    assert not (data / "tame.sqlite3").exists()


def multisite():
    return yaml.safe_load((ROOT / "docker-compose.multisite.yml").read_text())


def test_multisite_compose_has_postgres_two_replicas_two_sites_two_iperf3_servers():
    services = multisite()["services"]
    parser = build_parser()
    replicas = {name: s for name, s in services.items() if s.get("command", [None, None])[1:2] == ["serve"]}
    agents = {name: parser.parse_args(s["command"][1:]) for name, s in services.items()
              if s.get("command", [None, None])[1:2] == ["agent"]}
    iperfs = [name for name, s in services.items() if s.get("command", [None])[0] == "iperf3"]
    assert services["postgres"]["image"].startswith("postgres:")
    assert len(replicas) == 2 and len(agents) == 2 and len(iperfs) == 2
    for name, replica in replicas.items():
        # Stateless replicas: one PostgreSQL, no worker of their own (the sites' agents probe).
        assert replica["environment"]["TAME_DATABASE_URL"].startswith("postgresql://") and "@postgres:" in \
            replica["environment"]["TAME_DATABASE_URL"]
        assert "--no-worker" in replica["command"] and "postgres" in replica["depends_on"]
    assert len({a.site for a in agents.values()}) == 2  # two different sites
    # Each agent pushes to a replica of this file, and probes an iperf3 server of this file that the allow-list admits.
    allowed = AllowList.parse(services["api-1"]["environment"]["TAME_ALLOWED_DESTINATIONS"])
    for name, args in agents.items():
        host = args.push.split("//")[1].split(":")[0]
        assert host in replicas, (name, host)
        source = next(v for v in services[name]["volumes"] if v.endswith(":/etc/tame/destinations.txt:ro"))
        dests = read_destinations(ROOT / source.split(":")[0])
        assert [d.split(":")[0] for d in dests] in ([i] for i in iperfs), (name, dests)
        for dest in dests:  # a listed name is admitted whatever it resolves to (here: somewhere outside)
            allowed.check(parse_destination(dest), resolver=lambda host: ["192.0.2.1"])
        for dependency in services[name]["depends_on"]:
            assert dependency in services
    assert {tuple(read_destinations(ROOT / next(v for v in services[n]["volumes"]).split(":")[0])) for n in agents} \
        == {(f"{i}:5201",) for i in iperfs}


# What the operator exports before `docker compose -f docker-compose.multisite.yml up` (openssl rand -hex 32 each).
OPERATOR_TOKENS = {"TAME_TOKEN": "a" * 64, "TAME_SITE_A_TOKEN": "b" * 64, "TAME_SITE_B_TOKEN": "c" * 64,
                   "TAME_PG_PASSWORD": "d" * 64}
# Compose's ${VAR:?message}: the value of VAR, and when it is unset or empty compose refuses to start, saying message.
REQUIRED = re.compile(r"\$\{([A-Z_]+):\?([^}]*)\}")


def interpolated(env, given):
    """A compose service's environment as compose fills it from ``given``: ${VAR:-default} falls back to its
    default, ${VAR:?message} must be given (KeyError otherwise, as compose refuses to start)."""
    def one(value):
        value = REQUIRED.sub(lambda m: given[m.group(1)], str(value))
        return re.sub(r"\$\{([A-Z_]+):-([^}]*)\}", lambda m: given.get(m.group(1), m.group(2)), value)
    return {k: one(v) for k, v in env.items()}


COMPOSE_FILES = ("docker-compose.yml", "docker-compose.multisite.yml")
# Compose's ${VAR:-default} and ${VAR-default}: the value of VAR, else the default written in the file.
FALLBACK = re.compile(r"\$\{([A-Z_]+):?-([^}]*)\}")


def environments(name):
    """(service, key, value) of every environment entry of every service in compose file ``name``, anchors merged."""
    services = yaml.safe_load((ROOT / name).read_text())["services"]
    return [(service, key, str(value)) for service, body in services.items()
            for key, value in body.get("environment", {}).items()]


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_has_no_token_of_its_own(name):
    # Every token comes from the operator, with no default to fall back to: compose refuses to start without it.
    tokens = [(service, key, value) for service, key, value in environments(name) if "TOKEN" in key]
    assert tokens, name
    for service, key, value in tokens:
        assert not FALLBACK.search(value) and "${" in value, (service, key, value)
        for variable, message in REQUIRED.findall(value):
            assert message == f"set {variable} to a secret token, e.g. openssl rand -hex 32", message
        assert REQUIRED.sub("", value) in ("", "site-a:,site-b:"), (service, key, value)
        with pytest.raises(KeyError):
            interpolated({key: value}, {})


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_has_no_password_of_its_own(name):
    # A password written in the file, or a default for one, is known to everyone who can read the repository.
    passwords = [(service, key, value) for service, key, value in environments(name)
                 if "PASSWORD" in key or urlsplit(value).password is not None]
    assert passwords, name
    for service, key, value in passwords:
        for variable, default in FALLBACK.findall(value):
            # Only an empty one, for a service of an optional profile: compose reads every service, so requiring
            # the password there would stop the set-up without it; the postgres image refuses an empty password.
            assert default == "" and yaml.safe_load((ROOT / name).read_text())["services"][service].get("profiles"), \
                (service, key, value)
        literal = FALLBACK.sub("", REQUIRED.sub("", value))
        assert literal == "" if "PASSWORD" in key else not urlsplit(literal).password, (service, key, value)
    # Commented examples too: every user:PASSWORD@ in the file takes its password from the operator.
    for password in re.findall(r"://[^:/@\s]+:([^@\s]+)@", (ROOT / name).read_text()):
        assert password.startswith("${TAME_PG_PASSWORD"), password


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_file_says_how_to_set_its_secrets(name):
    # The header comment, the first thing an operator reads, says what to export before `docker compose up`.
    header = "".join(line for line in (ROOT / name).read_text().splitlines(True) if line.startswith("#"))
    for variable in sorted({v for _, _, value in environments(name) for v, _ in REQUIRED.findall(value)}):
        assert f"{variable}=$(openssl rand -hex 32)" in header, variable


def test_multisite_agents_each_hold_their_own_site_s_token():
    services = multisite()["services"]
    parser = build_parser()
    replicas = [s for s in services.values() if s.get("command", [None, None])[1:2] == ["serve"]]
    agents = {parser.parse_args(s["command"][1:]).site: s for s in services.values()
              if s.get("command", [None, None])[1:2] == ["agent"]}
    for replica in replicas:
        raw = replica["environment"]
        settings = Settings.from_env(interpolated(raw, OPERATOR_TOKENS))  # ConfigError if TAME_SITE_TOKENS is bad
        assert settings.token == OPERATOR_TOKENS["TAME_TOKEN"]
        tokens = dict((token, site) for site, token in settings.site_tokens)
        assert sorted(tokens.values()) == sorted(agents)
        for site, agent in agents.items():
            env = interpolated(agent["environment"], OPERATOR_TOKENS)
            # An agent's TAME_TOKEN is its own site's token: neither the operator's nor another site's.
            assert tokens.get(env["TAME_TOKEN"]) == site, site
            assert "TAME_SITE_TOKENS" not in env and "TAME_DATABASE_URL" not in env
            # Nor PostgreSQL's password: it shares the compose network, and would otherwise write past the API.
            assert OPERATOR_TOKENS["TAME_PG_PASSWORD"] not in "".join(env.values())
            # It probes within the replicas' allow-list.
            assert Settings.from_env(env).allowed.describe() == settings.allowed.describe()


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_postgres_has_the_highest_cpu_weight(name):
    # Beside loaded replicas on one host, PostgreSQL in a CPU cgroup of the default weight waited seconds for a CPU
    # (benchmarks.load_advice --store-cgroup; docs/advice-service.md); at cgroup v1's highest cpu.shares it kept up.
    services = yaml.safe_load((ROOT / name).read_text())["services"]
    assert services["postgres"]["cpu_shares"] == 262144
    assert all("cpu_shares" not in s for n, s in services.items() if n != "postgres")
