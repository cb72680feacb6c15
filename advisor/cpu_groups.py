"""Which CPU scheduling group a process on this host is in, and whether the group has the highest CPU weight (Linux:
/proc and the cgroup files of the cpu controller).

Beside loaded `tame serve` replicas on one host, a PostgreSQL in another scheduling group than theirs (its backends'
own autogroups, or a cgroup of its own at a container's default weight) waited seconds for a CPU, and most answers
went out marked stale; in their group, or at the highest weight, it kept up (docs/advice-service.md). `tame serve`
warns at start-up when its store is such a server (:func:`store_scheduling_warning`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from advisor.errors import StoreError

HIGHEST_CPU_SHARES = 262_144  # cgroup v1 cpu.shares' top
HIGHEST_CPU_WEIGHT = 10_000  # cgroup v2 cpu.weight's top


@dataclass(frozen=True)
class SchedulingGroup:
    """A process's CPU scheduling group: ``name`` says which ("CPU cgroup /x", "autogroup 85", "the root group");
    ``autogroup`` whether it is an autogroup; ``cgroups`` the cgroups it is in, from the top of the hierarchy down
    ("/a", then "/a/b"), each with whether it has the highest CPU weight (none for the root group or an autogroup)."""

    name: str
    autogroup: bool = False
    cgroups: tuple[tuple[str, bool], ...] = ()

    def outweighs_beside(self, other: "SchedulingGroup") -> bool:
        """Whether each cgroup this group is in and ``other`` is not has the highest weight, so that it wins a contest
        for a CPU against ``other`` at every level where the two are apart (never for the root or an autogroup)."""
        shared = {path for path, _ in other.cgroups}
        apart = [highest for path, highest in self.cgroups if path not in shared]
        return bool(apart) and all(apart)


def _cpu_mount() -> tuple[Path, PurePosixPath] | None:
    """Where this host's CPU controller is mounted, and which cgroup of its hierarchy the mount shows at its top ("/"
    for the hierarchy's root; a container's own cgroup where the runtime bind-mounted only that): a cgroup v1
    hierarchy with the ``cpu`` option, or a cgroup v2 hierarchy whose root hands ``cpu`` to its children."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_fields, _, fs_fields = line.partition(" - ")
        if len(mount_fields.split()) < 5 or len(fs_fields.split()) < 3:
            continue
        root, mount = (_unescape_mountinfo(field) for field in mount_fields.split()[3:5])
        fstype, _source, options = fs_fields.split()[:3]
        if fstype == "cgroup" and "cpu" in options.split(","):
            return Path(mount), PurePosixPath(root)
        if fstype == "cgroup2":
            try:
                if "cpu" in (Path(mount) / "cgroup.subtree_control").read_text().split():
                    return Path(mount), PurePosixPath(root)
            except OSError:  # a cgroup2 mount hidden under another mount, or gone: another line may still tell
                continue
    return None


def cpu_controller() -> Path | None:
    """Where this host's CPU controller is mounted (see :func:`_cpu_mount`); None when it is not."""
    found = _cpu_mount()
    return found[0] if found else None


def hierarchy_path(group: Path) -> str:
    """The path /proc/PID/cgroup gives for the cgroup whose folder is ``group`` (under :func:`cpu_controller`)."""
    mount, root = _cpu_mount()
    return str(root / group.relative_to(mount))


def _unescape_mountinfo(field: str) -> str:
    """A mountinfo path field as the path it names: the kernel writes space, tab, newline and backslash as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), field)


def _cgroup_path(pid: int | str, controller: Path) -> str | None:
    """The cgroup of process ``pid`` in the hierarchy mounted at ``controller`` ("/" the root), from /proc/PID/cgroup."""
    v2 = (controller / "cgroup.subtree_control").exists()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _id, controllers, path = line.split(":", 2)
        if (v2 and controllers == "") or (not v2 and "cpu" in controllers.split(",")):
            return path
    return None


def _hierarchy_root(controller: Path) -> bool:
    """Whether the cgroup mounted at ``controller`` is its hierarchy's root, not the group a cgroup namespace (an LXC
    container, docker --cgroupns=private) shows as "/": only the root has cgroup.sane_behavior (v1) and lacks
    cgroup.type (v2)."""
    if (controller / "cgroup.subtree_control").exists():
        return not (controller / "cgroup.type").exists()
    return (controller / "cgroup.sane_behavior").exists()


def _highest_weight(group: Path) -> bool:
    """Whether the cgroup at ``group`` has the highest CPU weight (cpu.shares on v1, cpu.weight on v2)."""
    if (group / "cpu.shares").exists():
        return int((group / "cpu.shares").read_text()) >= HIGHEST_CPU_SHARES
    return int((group / "cpu.weight").read_text()) >= HIGHEST_CPU_WEIGHT


def scheduling_group(pid: int | str) -> SchedulingGroup | None:
    """The CPU scheduling group of process ``pid`` ("self": this one); None when it cannot be told (no such process,
    its files unreadable, no cpu controller, a cgroup outside the part of the hierarchy this host's mount shows)."""
    try:
        found = _cpu_mount()
        path = _cgroup_path(pid, found[0]) if found else None
        if path is None:
            return None
        controller, root = found
        below = PurePosixPath(path).relative_to(root).parts  # ValueError: outside the mount (another container's)
        if ".." in below:  # outside this cgroup namespace
            return None
        # The mount's top is a cgroup with a weight of its own unless it is the hierarchy's root (the root group).
        top = [] if str(root) == "/" and _hierarchy_root(controller) else [0]
        levels = top + list(range(1, len(below) + 1))  # how many parts below the mount's top, for each cgroup
        if levels:
            return SchedulingGroup(f"CPU cgroup {path}",
                                   cgroups=tuple((str(root.joinpath(*below[:depth])),
                                                  _highest_weight(controller.joinpath(*below[:depth])))
                                                 for depth in levels))
        # Autogroups group processes of the root cgroup by session (setsid), when the kernel has them (a kernel built
        # without them has no such setting) and has them on.
        autogroups = Path("/proc/sys/kernel/sched_autogroup_enabled")
        if autogroups.exists() and autogroups.read_text().strip() == "1":
            autogroup = Path(f"/proc/{pid}/autogroup").read_text().split()[0]  # "/autogroup-85"
            return SchedulingGroup(f"autogroup {autogroup.rpartition('-')[2]}", autogroup=True)
        return SchedulingGroup("the root group")
    except (OSError, ValueError, IndexError):
        return None


def store_scheduling_warning(db) -> str | None:
    """What to tell an operator whose PostgreSQL store (``db``, an advisor.db.Database) runs on this host in another
    CPU scheduling group than this process, at less than the highest weight; None when it does not, or cannot be
    told (SQLite, a server elsewhere or in another PID namespace, a Unix-socket connection, unreadable files)."""
    if db.dialect != "postgresql":
        return None
    try:
        with db.transaction() as tx:
            # A server that refuses these (a role denied them, a PostgreSQL look-alike) cannot be told: this is
            # advice, and must not keep `tame serve` from starting.
            pid, port = tx.execute("SELECT pg_backend_pid(), inet_client_port()").fetchone()
            # The backend's title names its client's address and port: only then is pid that backend here.
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if port is None or not title.startswith("postgres:") or f"({port})" not in title:
                return None
            theirs, ours = scheduling_group(pid), scheduling_group("self")
    except (StoreError, OSError):
        return None
    if theirs is None or ours is None or theirs == ours or theirs.outweighs_beside(ours):
        return None
    weights = f"compose: cpu_shares: {HIGHEST_CPU_SHARES}; systemd: CPUWeight={HIGHEST_CPU_WEIGHT}"
    autogroup_off = "with neither in a cgroup: sysctl -w kernel.sched_autogroup_enabled=0"
    if theirs.autogroup:
        # Each backend calls setsid(), so each has an autogroup of its own: the one asked is only an example, and
        # there is no cgroup of PostgreSQL's to weight.
        where = f"with each backend in an autogroup of its own (this one's: {theirs.name})"
        fixes = f"Run both in one group ({autogroup_off}), or PostgreSQL in a cgroup at the highest weight ({weights})"
    else:
        where = f"in {theirs.name}"
        fixes = f"Give its cgroup the highest weight ({weights}), or run both in one group ({autogroup_off})"
    return (f"the PostgreSQL store runs on this host {where}, this server in {ours.name}: beside loaded replicas, "
            "PostgreSQL in another scheduling group at less than the highest CPU weight waited seconds for a CPU and "
            f"most answers went out stale. {fixes}; docs/advice-service.md")
