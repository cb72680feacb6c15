"""`tame serve` warns when its PostgreSQL store runs on this host in another CPU scheduling group at less than the
highest weight (advisor/cpu_groups.py): a real cluster moved into a real cgroup, a real `tame serve`."""

import os
import shutil
import subprocess
import sys

import pytest

from pathlib import Path

from advisor.cpu_groups import (HIGHEST_CPU_SHARES, SchedulingGroup, cpu_controller, hierarchy_path, scheduling_group,
                                scheduling_warning, weight_file)
from benchmarks.load_advice import cpu_cgroup, move_store
from tests.api.procs import start_serve, stop
from tests.conftest import throwaway_cluster

WARNING = "tame serve: warning: the PostgreSQL store runs on this host in CPU cgroup "


def _cgroup_view() -> str:
    """This process's cgroups and this host's cgroup mounts, for a failure's message."""
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if " - cgroup" in line]
    return Path("/proc/self/cgroup").read_text() + "\n".join(mounts)


def _v1_cpu_controller() -> Path:
    """This host's cgroup v1 cpu hierarchy, which the tests that mount it again need; the test is skipped without."""
    controller = cpu_controller()
    if controller is None or not (controller / "cpu.shares").exists():
        pytest.skip("needs a cgroup v1 cpu hierarchy")
    return controller


def _serve_stderr(tmp_path, env, cgroup=None) -> str:
    """What a `tame serve` started in ``cgroup`` (a folder; else this process's) wrote to stderr by the time it
    answered."""
    proc, base = start_serve(tmp_path, tmp_path / "unused.sqlite3", env=env, args=["--no-worker"], cgroup=cgroup)
    try:
        port = base.rsplit(":", 1)[1]
        return (tmp_path / f"serve-{port}.err").read_text(errors="replace")
    finally:
        stop(proc)


def _cpu_controller_as_root() -> Path:
    """This host's CPU controller, where the tests make cgroups of their own; skipped without root or one."""
    controller = cpu_controller()
    if controller is None or os.geteuid() != 0:
        pytest.skip("needs root and a cgroup hierarchy with the cpu controller")
    return controller


def _group_of_a_process_in(folder: Path) -> SchedulingGroup | None:
    """scheduling_group() of a child process moved into the cgroup whose folder is ``folder``."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        (folder / "cgroup.procs").write_text(str(child.pid))
        return scheduling_group(child.pid)
    finally:
        child.kill()
        child.wait()


def _root_cgroup_with_autogroups() -> Path:
    """The folder of the hierarchy's root cgroup, where a process is in an autogroup: skipped where this host's
    mount does not show the root (a container's) or autogroups are off."""
    controller = _cpu_controller_as_root()
    found = _group_of_a_process_in(controller)
    if found is None or not found.autogroup:
        pytest.skip(f"needs the hierarchy's root cgroup and autogroups on; a process in {controller} is in {found}")
    return controller


def _server_cgroup(controller: Path):
    """A cgroup of the default weight for the `tame serve` under test, so that its group is known wherever the
    test runner sits (a container's cgroup, a CI job's)."""
    return cpu_cgroup(controller, 1024, name=f"tame-serve-{os.getpid()}")


def test_a_process_that_is_not_there_has_no_group_and_one_in_a_cgroup_has_that_one():
    assert scheduling_group(2**22 + 1) is None  # above the kernel's pid_max limit: never a process
    controller = _cpu_controller_as_root()
    with cpu_cgroup(controller, 1024) as group:
        found = _group_of_a_process_in(group)
        path = hierarchy_path(group)
        assert found is not None, _cgroup_view()
        # Above it, the cgroup the runner's mount shows at its top, if that is not the hierarchy's root.
        assert (found.name, found.cgroups[-1], found.autogroup) == (f"CPU cgroup {path}", (path, False), False)


@pytest.mark.postgres
def test_serve_warns_while_its_store_is_in_a_cgroup_of_the_default_weight_and_not_at_the_highest(tmp_path):
    controller = _cpu_controller_as_root()
    with _server_cgroup(controller) as server, cpu_cgroup(controller, 1024) as group, throwaway_cluster() as url:
        move_store(url, group)
        (tmp_path / "default").mkdir()
        err = _serve_stderr(tmp_path / "default", {"TAME_DATABASE_URL": url}, server)
        assert f"{WARNING}{hierarchy_path(group)}, this server in CPU cgroup {hierarchy_path(server)}: " in err, err
        assert f"Give {hierarchy_path(group)} the highest weight" in err, err
        assert "cpu_shares: 262144" in err and "kernel.sched_autogroup_enabled=0" in err, err

        file, highest = weight_file(group)
        file.write_text(str(highest))
        (tmp_path / "highest").mkdir()
        err = _serve_stderr(tmp_path / "highest", {"TAME_DATABASE_URL": url}, server)
        assert "warning" not in err, err


def test_serve_on_sqlite_does_not_warn(tmp_path):
    proc, base = start_serve(tmp_path, tmp_path / "advice.sqlite3", args=["--no-worker"])
    stop(proc)
    err = (tmp_path / f"serve-{base.rsplit(':', 1)[1]}.err").read_text(errors="replace")
    assert "warning" not in err, err


@pytest.mark.postgres
def test_serve_starts_when_its_role_may_not_ask_which_backend_it_has(tmp_path):
    # A hardened server (or a PostgreSQL look-alike) that refuses inet_client_port(): the check is advice, so it is
    # skipped, and tame serve still starts.
    import psycopg

    with throwaway_cluster() as url:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("CREATE ROLE tame_app LOGIN")
            admin.execute("CREATE DATABASE tame_app OWNER tame_app")
        app_url = url.rsplit("/", 1)[0].replace("postgres@", "tame_app@", 1) + "/tame_app"
        with psycopg.connect(app_url.replace("tame_app@", "postgres@", 1), autocommit=True) as admin:
            admin.execute("REVOKE EXECUTE ON FUNCTION inet_client_port() FROM PUBLIC")
        proc, base = start_serve(tmp_path, tmp_path / "unused.sqlite3", env={"TAME_DATABASE_URL": app_url},
                                 args=["--no-worker"])
        stop(proc)


def _in_own_mount_namespace(script: str, code: str) -> str:
    """Run ``script`` (sh) then ``code`` (Python, this checkout) in a private mount namespace of their own, so the
    mounts it changes are this run's alone and vanish with it: the Python's stdout."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to change mounts in a namespace of its own")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-ec",
                           f'{script}\nexec "$0" -c "$1"', sys.executable, code],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_cpu_controller_reads_mount_points_with_spaces_and_passes_over_mounts_it_cannot_read(tmp_path):
    # mountinfo writes a space in a mount point as \040. Here the cpu controller is mounted again under a folder
    # with a space, after a cgroup2 mount (no cpu: this host's is elsewhere) under a folder with a space too.
    controller = _v1_cpu_controller()
    spaced = tmp_path / "tame h4"
    script = (f"umount {controller}\n"
              f"mkdir -p '{spaced}/two' '{spaced}/cpu x'\n"
              f"mount -t cgroup2 none '{spaced}/two'\n"
              f"mount -t cgroup -o cpu none '{spaced}/cpu x'")
    out = _in_own_mount_namespace(script, "from advisor.cpu_groups import cpu_controller; print(cpu_controller())")
    assert out.strip() == str(spaced / "cpu x"), out


@pytest.mark.postgres
def test_no_warning_when_server_and_store_share_the_cgroup_a_cgroup_namespace_calls_its_root(tmp_path):
    # In a cgroup namespace (an LXC container, docker --cgroupns=private) /proc/PID/cgroup says "/" for the
    # namespace's own group, which is not the hierarchy's root: autogroups do not apply there, so a server and its
    # store both in it share one scheduling group, whatever their autogroups say.
    controller = _v1_cpu_controller()
    code = ("import psycopg\n"
            "from advisor.cpu_groups import scheduling_group, store_scheduling_warning\n"
            "from advisor.db import Database\n"
            "from tests.conftest import throwaway_cluster\n"
            "with throwaway_cluster() as url:\n"
            "    with psycopg.connect(url) as conn:\n"
            "        print(scheduling_group(conn.execute('SELECT pg_backend_pid()').fetchone()[0]))\n"
            "    print(scheduling_group('self'))\n"
            "    print(store_scheduling_warning(Database(url)))\n")
    with cpu_cgroup(controller, 1024) as group:
        script = (f"echo $$ > {group}/cgroup.procs\n"
                  f"umount {controller}\n"
                  f'exec unshare --cgroup sh -ec "mount -t cgroup -o cpu none {controller}; exec \\"\\$0\\" -c \\"\\$1\\"" '
                  '"$0" "$1"')
        out = _in_own_mount_namespace(script, code)
    backend, own, warning = out.strip().splitlines()[-3:]
    assert own == backend == repr(SchedulingGroup("CPU cgroup /", cgroups=(("/", False),))), out
    assert warning == "None", out


@pytest.mark.postgres
def test_the_warning_names_a_cgroup_with_odd_characters_escaped(tmp_path):
    # A cgroup's name is any bytes but "/": a colon and a space are kept, a control character (here the terminal's
    # escape) is written out, not sent to the operator's terminal.
    controller = _cpu_controller_as_root()
    with (_server_cgroup(controller) as server, cpu_cgroup(controller, 1024, name=f"tame-h4-{os.getpid()} a:b\x1b[2J") as group,
          throwaway_cluster() as url):
        move_store(url, group)
        err = _serve_stderr(tmp_path, {"TAME_DATABASE_URL": url}, server)
    assert "\x1b" not in err, repr(err)
    assert WARNING + hierarchy_path(group).replace("\x1b", "\\x1b") + ", this server" in err, err


@pytest.mark.postgres
def test_under_autogroup_the_warning_says_each_backend_has_its_own_and_gives_the_fixes_that_apply(tmp_path):
    # The measured bad case as this host has it by default: a PostgreSQL backend calls setsid(), so each is in an
    # autogroup of its own, none in a cgroup. The warning names no single group for the store and does not tell
    # the operator to weight "its cgroup", which it does not have.
    root = _root_cgroup_with_autogroups()
    with throwaway_cluster() as url:
        move_store(url, root)
        err = _serve_stderr(tmp_path, {"TAME_DATABASE_URL": url}, root)
    assert "tame serve: warning: the PostgreSQL store runs on this host with each backend in an autogroup of its " \
           "own (this one's: autogroup " in err, err
    assert "Give " not in err, err  # there is no cgroup of the store's to weight
    assert "kernel.sched_autogroup_enabled=0" in err and "cpu_shares: 262144" in err, err


@pytest.mark.postgres
def test_the_weight_that_counts_is_the_store_cgroups_where_it_parts_from_the_servers(tmp_path):
    # A cgroup's weight counts only against its siblings: PostgreSQL at the highest weight inside a parent of the
    # default weight still contests the server's group at the parent's weight; with the parent at the highest, the
    # leaf's weight no longer matters against the server; with the server's group at the highest too, they are even.
    controller = _cpu_controller_as_root()
    with (_server_cgroup(controller) as server, cpu_cgroup(controller, 1024) as parent,
          cpu_cgroup(parent, HIGHEST_CPU_SHARES, name="store") as leaf, throwaway_cluster() as url):
        move_store(url, leaf)
        (tmp_path / "parent-default").mkdir()
        err = _serve_stderr(tmp_path / "parent-default", {"TAME_DATABASE_URL": url}, server)
        assert f"{WARNING}{hierarchy_path(leaf)}, this server" in err, err
        assert f"Give {hierarchy_path(parent)} the highest weight" in err, err  # the leaf has it: where they part
        for folder, weight, warned in ((parent, "highest", False), (leaf, "default", False), (server, "highest", True)):
            file, highest = weight_file(folder)
            file.write_text(str(highest) if weight == "highest" else "1024" if file.name == "cpu.shares" else "100")
            (tmp_path / f"{folder.name}-{weight}").mkdir()
            err = _serve_stderr(tmp_path / f"{folder.name}-{weight}", {"TAME_DATABASE_URL": url}, server)
            # The parent meets the server's group: its weight wins or not, whatever the leaf's below it.
            assert ("warning" in err) == warned, (folder, weight, err)
        assert f"{hierarchy_path(parent)} and this server's {hierarchy_path(server)} both have the highest" in err, err


@pytest.mark.postgres
def test_under_a_mount_of_one_cgroup_as_a_container_has_groups_are_named_and_weighed_from_the_hierarchy(tmp_path):
    # Docker without a cgroup namespace bind-mounts only the container's own cgroup at /sys/fs/cgroup/cpu: mountinfo
    # gives the mount's root as that cgroup, /proc/PID/cgroup gives paths from the hierarchy's top. Here a cgroup of
    # this test's is so mounted, in a mount namespace of its own, with the server in it and its store in a child.
    controller = _v1_cpu_controller()
    code = ("from advisor.cpu_groups import cpu_controller, scheduling_group, store_scheduling_warning\n"
            "from advisor.db import Database\n"
            "from benchmarks.load_advice import cpu_cgroup, move_store\n"
            "from tests.conftest import throwaway_cluster\n"
            "print(scheduling_group('self'))\n"
            "with cpu_cgroup(cpu_controller(), 1024, name='store') as store, throwaway_cluster() as url:\n"
            "    move_store(url, store)\n"
            "    print(store_scheduling_warning(Database(url)))\n")
    with cpu_cgroup(controller, 1024) as group:
        bound = tmp_path / "bound"
        script = (f"mkdir '{bound}'\n"
                  f"echo $$ > '{group}/cgroup.procs'\n"
                  f"mount --bind '{group}' '{bound}'\n"
                  f"umount '{controller}'\n"
                  f"mount --move '{bound}' '{controller}'")
        out = _in_own_mount_namespace(script, code)
    own, warning = out.strip().splitlines()[-2:]
    path = hierarchy_path(group)
    assert own == repr(SchedulingGroup(f"CPU cgroup {path}", cgroups=((path, False),))), out
    assert warning.startswith(f"the PostgreSQL store runs on this host in CPU cgroup {path}/store, this server in "
                              f"CPU cgroup {path}: "), out
    assert f"Give {path}/store the highest weight" in warning, out


def test_a_kernel_without_autogroups_puts_a_process_of_the_root_cgroup_in_the_root_group():
    # A kernel built without autogroups has no kernel.sched_autogroup_enabled: here the setting is hidden under an
    # empty tmpfs in a mount namespace of this test's own.
    root = _root_cgroup_with_autogroups()
    out = _in_own_mount_namespace(f"echo $$ > '{root}/cgroup.procs'\nmount -t tmpfs none /proc/sys/kernel",
                                  "from advisor.cpu_groups import scheduling_group; print(scheduling_group('self'))")
    assert out.strip() == repr(SchedulingGroup("the root group")), out


# cgroup v2 with the cpu controller cannot run on this test bed (its kernel binds cpu to a v1 hierarchy, and a
# controller is in one hierarchy only), so its layouts are recorded trees: /proc and /sys files as a systemd host
# has them, read through scheduling_group's host argument.
V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"


def _host(tmp_path, mountinfo: str, procs: dict[str, str], groups: dict[str, tuple[str, int | None]]) -> Path:
    """A recorded host under ``tmp_path``: its mountinfo, each process's /proc/PID/cgroup text, and each cgroup's
    folder below /sys/fs/cgroup with its cgroup.controllers and cpu.weight (None: no weight file)."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/mountinfo").write_bytes(os.fsencode(mountinfo + "\n"))
    for pid, cgroup in procs.items():
        (tmp_path / "proc" / pid).mkdir(parents=True, exist_ok=True)
        (tmp_path / "proc" / pid / "cgroup").write_text(cgroup + "\n")
        (tmp_path / "proc" / pid / "autogroup").write_text(f"/autogroup-{len(pid)} nice 0\n")
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/sched_autogroup_enabled").write_text("1\n")
    for path, (controllers, weight) in groups.items():
        folder = tmp_path / "sys/fs/cgroup" / path.lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cgroup.controllers").write_text(controllers + "\n")
        if path == "/":
            (folder / "cgroup.subtree_control").write_text("cpu\n" if "cpu" in controllers else "\n")
        else:
            (folder / "cgroup.type").write_text("domain\n")
        if weight is not None:
            (folder / "cpu.weight").write_text(f"{weight}\n")
    return tmp_path


def test_v2_a_process_contends_in_its_deepest_cgroup_that_was_handed_cpu(tmp_path):
    # systemd: the root hands cpu to its slices; user.slice does not hand it on, so a login session's processes
    # contend as user.slice. PostgreSQL's unit has the highest weight, system.slice the default: at the top the two
    # slices meet on even terms, so the unit's weight alone does not win.
    host = _host(tmp_path, V2_MOUNT,
                 {"self": "0::/user.slice/user-0.slice/session-1.scope",
                  "4242": "0::/system.slice/postgresql@15-main.service"},
                 {"/": ("cpu io memory", None), "/user.slice": ("cpu io memory", 100),
                  "/user.slice/user-0.slice": ("memory", None), "/user.slice/user-0.slice/session-1.scope": ("", None),
                  "/system.slice": ("cpu io memory", 100),
                  "/system.slice/postgresql@15-main.service": ("cpu", 10_000)})
    server = scheduling_group("self", host)
    store = scheduling_group(4242, host)
    assert server == SchedulingGroup("CPU cgroup /user.slice", cgroups=(("/user.slice", False),))
    assert store.cgroups == (("/system.slice", False), ("/system.slice/postgresql@15-main.service", True))
    assert "Give /system.slice the highest weight" in scheduling_warning(store, server)
    (host / "sys/fs/cgroup/system.slice/cpu.weight").write_text("10000\n")
    assert scheduling_warning(scheduling_group(4242, host), server) is None
    # Below the slice the unit's own weight shares out only the slice's: at the default it still wins.
    (host / "sys/fs/cgroup/system.slice/postgresql@15-main.service/cpu.weight").write_text("100\n")
    assert scheduling_warning(scheduling_group(4242, host), server) is None
    # Both slices at the highest weight meet on even terms.
    (host / "sys/fs/cgroup/user.slice/cpu.weight").write_text("10000\n")
    warning = scheduling_warning(scheduling_group(4242, host), scheduling_group("self", host))
    assert "/system.slice and this server's /user.slice both have the highest weight" in warning, warning


def test_the_store_outweighs_a_server_with_no_cgroup_apart_from_it_by_its_own_cgroups_weight():
    top, default = ("/pg", True), ("/pg", False)
    for server in (SchedulingGroup("autogroup 7", autogroup=True), SchedulingGroup("the root group"),
                   SchedulingGroup("CPU cgroup /a", cgroups=(("/a", False),))):
        store = SchedulingGroup("CPU cgroup /pg", cgroups=(top,)) if server.cgroups == () else \
            SchedulingGroup("CPU cgroup /a/pg", cgroups=(("/a", False), ("/a/pg", True)))  # the server in its parent
        assert scheduling_warning(store, server) is None, server
    warning = scheduling_warning(SchedulingGroup("CPU cgroup /pg", cgroups=(default,)), SchedulingGroup("the root group"))
    assert "Give /pg the highest weight" in warning and "give it less" not in warning, warning
    # Beside a server whose cgroup has the highest weight, weighting the store alone would only make them even.
    warning = scheduling_warning(SchedulingGroup("autogroup 9", autogroup=True),
                                 SchedulingGroup("CPU cgroup /srv", cgroups=(("/srv", True),)))
    assert "this server's /srv has the highest weight too, so give it less as well" in warning, warning


def test_v2_without_cpu_below_the_root_every_process_is_in_the_root_group_and_autogroups_apply(tmp_path):
    host = _host(tmp_path, V2_MOUNT, {"self": "0::/user.slice/session-1.scope", "4242": "0::/system.slice/pg"},
                 {"/": ("cpu memory", None), "/user.slice": ("memory", None), "/system.slice": ("memory", None),
                  "/user.slice/session-1.scope": ("", None), "/system.slice/pg": ("", None)})
    assert scheduling_group("self", host) == SchedulingGroup("autogroup 4", autogroup=True)
    (host / "proc/sys/kernel/sched_autogroup_enabled").write_text("0\n")
    assert scheduling_group(4242, host) == SchedulingGroup("the root group")


def test_a_hybrid_host_takes_its_v1_cpu_hierarchy_over_a_cgroup2_mount_without_cpu_under_an_odd_name(tmp_path):
    # As this test bed is: a cgroup2 hierarchy with no controllers beside v1 ones; the cpu mount point's name is not
    # UTF-8, which /proc writes as it is.
    odd = "cpu\udcff"
    mountinfo = (V2_MOUNT.replace("/sys/fs/cgroup ", "/sys/fs/cgroup/unified ") + "\n"
                 f"32 31 0:29 / /sys/fs/cgroup/{odd} rw,relatime - cgroup cgroup rw,cpu")
    host = _host(tmp_path, mountinfo, {"self": "1:cpu:/a\n0::/"}, {"/unified": ("", None)})
    cpu = host / "sys/fs/cgroup" / odd
    (cpu / "a").mkdir(parents=True)
    (cpu / "cgroup.sane_behavior").write_text("0\n")
    (cpu / "a/cpu.shares").write_text("1024\n")
    assert cpu_controller(host) == cpu
    assert scheduling_group("self", host) == SchedulingGroup("CPU cgroup /a", cgroups=(("/a", False),))
