"""docker-compose.yml and the Dockerfile refer to things that exist (no Docker engine runs here)."""

import shlex
from pathlib import Path

import yaml

from advisor.allowlist import AllowList
from advisor.cli import build_parser
from advisor.commands.agent import read_destinations

ROOT = Path(__file__).resolve().parents[1]


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
