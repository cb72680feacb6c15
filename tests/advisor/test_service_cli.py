import json
import os
import subprocess
import sys

import pytest

from advisor.commands.agent import _enqueue_due, read_destinations
from advisor.cli import UsageError
from advisor.errors import ConfigError
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store


def test_settings_are_validated_naming_the_variable():
    settings = Settings.from_env({"TAME_TOKEN": "t", "TAME_ALLOWED_DESTINATIONS": "10.0.0.0/8, dtn.example.org",
                                  "TAME_PROBE_LEVELS": "10,1", "XDG_DATA_HOME": "/var/lib/x"})
    assert settings.token == "t" and settings.default_levels == (1, 10)
    assert settings.database_url == "sqlite:////var/lib/x/tame/tame.sqlite3"
    for env, name in (({"TAME_TTL_S": "soon"}, "TAME_TTL_S"), ({"TAME_DATABASE_URL": "mysql://x"}, "TAME_DATABASE_URL"),
                      ({"TAME_PROBE_LEVELS": "4"}, "TAME_PROBE_LEVELS"), ({"TAME_MODEL": "x"}, "TAME_MODEL"),
                      ({"TAME_ALLOWED_DESTINATIONS": "bad..name"}, "TAME_ALLOWED_DESTINATIONS")):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env(env)


def test_agent_queues_missing_destinations_once(tmp_path):
    dest_file = tmp_path / "dests.txt"
    dest_file.write_text("# paths\n127.0.0.1\n127.0.0.2:5202  # second\n\n192.0.2.1\n")
    assert read_destinations(dest_file) == ["127.0.0.1:5201", "127.0.0.2:5202", "192.0.2.1:5201"]
    store = Store.open(f"sqlite:///{tmp_path}/s.sqlite3")
    service = AdviceService(store, Settings())
    _enqueue_due(service, read_destinations(dest_file))
    _enqueue_due(service, read_destinations(dest_file))
    # 192.0.2.1 is outside the default (loopback) allow-list: refused, not queued.
    assert store.job_counts() == {"queued": 2}
    store.close()
    (tmp_path / "bad.txt").write_text("ok.example\nnot a host\n")
    with pytest.raises(UsageError, match="bad.txt:2"):
        read_destinations(tmp_path / "bad.txt")


def test_tame_paths_lists_the_store(tmp_path):
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/s.sqlite3"}
    empty = subprocess.run([sys.executable, "-m", "advisor", "paths"], env=env, capture_output=True, text=True, timeout=60)
    assert empty.returncode == 0 and "no destinations yet" in empty.stdout
    result = subprocess.run([sys.executable, "-m", "advisor", "paths", "--json"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert json.loads(result.stdout) == {"paths": []}
    bad = subprocess.run([sys.executable, "-m", "advisor", "paths"], env={**env, "TAME_TTL_S": "x"},
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "TAME_TTL_S" in bad.stderr
