"""Which CPU scheduling group a process on this host is in, and whether the group has the highest CPU weight (Linux:
/proc and the cgroup files of the cpu controller).

Beside loaded `tame serve` replicas on one host, a PostgreSQL in another scheduling group than theirs (its backends'
own autogroups, or a cgroup of its own at a container's default weight) waited seconds for a CPU, and most answers
went out marked stale; in their group, or at the highest weight, it kept up (docs/advice-service.md). `tame serve`
warns at start-up when its store is such a server (:func:`store_scheduling_warning`).
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from advisor.errors import StoreError

HIGHEST_CPU_SHARES = 262_144  # cgroup v1 cpu.shares' top
HIGHEST_CPU_WEIGHT = 10_000  # cgroup v2 cpu.weight's top
HOST = Path("/")  # where /proc and the cgroup mounts are read from; a recorded tree in the tests


@dataclass(frozen=True)
class SchedulingGroup:
    """A process's CPU scheduling group: ``name`` says which ("CPU cgroup /x", "autogroup 85", "the root group");
    ``autogroup`` whether it is an autogroup; ``cgroups`` the cgroups with a CPU weight of their own that it is in,
    from the top of what this host's mount shows down ("/a", then "/a/b"), each with whether it has the highest
    weight (none for the root group or an autogroup)."""

    name: str
    autogroup: bool = False
    cgroups: tuple[tuple[str, bool], ...] = ()

    def parting_from(self, other: "SchedulingGroup") -> tuple[tuple[str, bool] | None, tuple[str, bool] | None]:
        """Where this group and ``other`` part: the top cgroup of each that the other is not in, with whether it has
        the highest weight; None for one in no cgroup apart from the other's (the root group, an autogroup, a
        parent of the other's cgroup). Those two contend for a CPU by their weights; the cgroups below them only
        share out what their top gets."""
        def top_apart(group, beside):
            shared = {path for path, _ in beside.cgroups}
            return next(((path, highest) for path, highest in group.cgroups if path not in shared), None)

        return top_apart(self, other), top_apart(other, self)


def weight_file(group: Path) -> tuple[Path, int]:
    """The file holding the CPU weight of the cgroup whose folder is ``group``, and the file's highest value:
    cpu.shares on cgroup v1, cpu.weight on v2."""
    if (group / "cpu.shares").exists():
        return group / "cpu.shares", HIGHEST_CPU_SHARES
    return group / "cpu.weight", HIGHEST_CPU_WEIGHT


@dataclass(frozen=True)
class _CpuMount:
    """Where the CPU controller is mounted (``folder``), which cgroup the mount shows at its top (``root``: "/" for
    the hierarchy's top, a container's own cgroup where the runtime bind-mounted only that), and whether the
    hierarchy is cgroup v2."""

    folder: Path
    root: PurePosixPath
    v2: bool

    def has_weight(self, group: Path) -> bool:
        """Whether the cgroup at ``group`` (below the mount) has a CPU weight of its own: every one on cgroup v1; on
        v2 one whose parent hands it ``cpu``, else its processes contend as part of the parent."""
        return not self.v2 or "cpu" in _read(group / "cgroup.controllers").split()

    def hierarchy_top(self) -> bool:
        """Whether the mount's top is its hierarchy's root, not the group a cgroup namespace (an LXC container, docker
        --cgroupns=private) shows as "/": only the root has cgroup.sane_behavior (v1) and lacks cgroup.type (v2)."""
        if str(self.root) != "/":
            return False
        if self.v2:
            return not (self.folder / "cgroup.type").exists()
        return (self.folder / "cgroup.sane_behavior").exists()


def _read(path: Path) -> str:
    """A /proc or cgroup file's text, its bytes decoded as file names are (a mount point need not be UTF-8)."""
    return os.fsdecode(path.read_bytes())


def _cpu_mount(host: Path) -> _CpuMount | None:
    """This host's CPU controller: a cgroup v1 hierarchy with the ``cpu`` option, or a cgroup v2 hierarchy that has
    ``cpu`` (a hybrid host's cgroup2 mount without it is passed over); None when neither is mounted."""
    for line in _read(host / "proc/self/mountinfo").splitlines():
        mount_fields, _, fs_fields = line.partition(" - ")
        if len(mount_fields.split()) < 5 or len(fs_fields.split()) < 3:
            continue
        root, point = (_unescape_mountinfo(field) for field in mount_fields.split()[3:5])
        folder = host / point.lstrip("/")
        fstype, _source, options = fs_fields.split()[:3]
        if fstype == "cgroup" and "cpu" in options.split(","):
            return _CpuMount(folder, PurePosixPath(root), v2=False)
        if fstype == "cgroup2":
            try:
                if "cpu" in _read(folder / "cgroup.controllers").split():
                    return _CpuMount(folder, PurePosixPath(root), v2=True)
            except OSError:  # a cgroup2 mount hidden under another mount, or gone: another line may still tell
                continue
    return None


def cpu_controller(host: Path = HOST) -> Path | None:
    """The folder this host's CPU controller is mounted at; None when it is not mounted."""
    mount = _cpu_mount(host)
    return mount.folder if mount else None


def hierarchy_path(group: Path, host: Path = HOST) -> str:
    """The path /proc/PID/cgroup gives for the cgroup whose folder is ``group``, below :func:`cpu_controller`."""
    mount = _cpu_mount(host)
    if mount is None:
        raise ValueError("this host has no CPU controller mounted: there is no cgroup folder to name")
    return str(mount.root / group.relative_to(mount.folder))


def _unescape_mountinfo(field: str) -> str:
    """A mountinfo path field as the path it names: the kernel writes space, tab, newline and backslash as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), field)


def _cgroup_path(pid: int | str, mount: _CpuMount, host: Path) -> str | None:
    """The cgroup of process ``pid`` in the CPU controller's hierarchy ("/" its top), from /proc/PID/cgroup."""
    for line in _read(host / f"proc/{pid}/cgroup").splitlines():
        _id, controllers, path = line.split(":", 2)
        if (mount.v2 and controllers == "") or (not mount.v2 and "cpu" in controllers.split(",")):
            return path
    return None


def scheduling_group(pid: int | str, host: Path = HOST) -> SchedulingGroup | None:
    """The CPU scheduling group of process ``pid`` ("self": this one); None when it cannot be told (no such process,
    its files unreadable, no cpu controller, a cgroup outside the part of the hierarchy this host's mount shows)."""
    try:
        mount = _cpu_mount(host)
        path = _cgroup_path(pid, mount, host) if mount else None
        if path is None:
            return None
        below = PurePosixPath(path).relative_to(mount.root).parts  # ValueError: outside the mount (another container's)
        if ".." in below:  # outside this cgroup namespace
            return None
        # How many parts below the mount's top, for each cgroup the process is in: the top itself unless it is the
        # hierarchy's root group, which has no weight. Only those with a weight of their own count (cgroup v2).
        depths = ([] if mount.hierarchy_top() else [0]) + list(range(1, len(below) + 1))
        weighted = list(itertools.takewhile(lambda depth: mount.has_weight(mount.folder.joinpath(*below[:depth])),
                                            depths))
        if depths and depths[0] == 0 and not weighted:  # it contends in a cgroup above what the mount shows
            return None
        if weighted:
            cgroups = []
            for depth in weighted:
                file, highest = weight_file(mount.folder.joinpath(*below[:depth]))
                cgroups.append((str(mount.root.joinpath(*below[:depth])), int(_read(file)) >= highest))
            return SchedulingGroup(f"CPU cgroup {cgroups[-1][0]}", cgroups=tuple(cgroups))
        # Autogroups group processes of the root cgroup by session (setsid), when the kernel has them (a kernel built
        # without them has no such setting) and has them on.
        autogroups = host / "proc/sys/kernel/sched_autogroup_enabled"
        if autogroups.exists() and _read(autogroups).strip() == "1":
            autogroup = _read(host / f"proc/{pid}/autogroup").split()[0]  # "/autogroup-85"
            return SchedulingGroup(f"autogroup {autogroup.rpartition('-')[2]}", autogroup=True)
        return SchedulingGroup("the root group")
    except (OSError, ValueError, IndexError):
        return None


def store_scheduling_warning(db) -> str | None:
    """What to tell an operator whose PostgreSQL store (``db``, an advisor.db.Database) runs on this host in another
    CPU scheduling group than this process that does not outweigh it (where the two part, the store's cgroup at the
    highest weight and this process's not); None when it does not, or cannot be told (SQLite, a server elsewhere or
    in another PID namespace, a Unix-socket connection, unreadable files)."""
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
    return scheduling_warning(theirs, ours)


def scheduling_warning(theirs: SchedulingGroup | None, ours: SchedulingGroup | None) -> str | None:
    """What to tell an operator whose PostgreSQL store is in scheduling group ``theirs`` and this server in ``ours``
    (None: cannot be told); None when the store outweighs the server or shares its group."""
    if theirs is None or ours is None or theirs == ours:
        return None
    store_top, server_top = theirs.parting_from(ours)
    store_highest = store_top is not None and store_top[1]
    server_highest = server_top is not None and server_top[1]
    if store_highest and not server_highest:
        return None  # where the two part, the store's cgroup has the highest weight and the server's not
    weights = f"compose: cpu_shares: {HIGHEST_CPU_SHARES}; systemd: CPUWeight={HIGHEST_CPU_WEIGHT}"
    autogroup_off = "with neither in a cgroup: sysctl -w kernel.sched_autogroup_enabled=0"
    where = f"in {theirs.name}"
    if theirs.autogroup:
        # Each backend calls setsid(), so each has an autogroup of its own: the one asked is only an example, and
        # there is no cgroup of PostgreSQL's to weight.
        where = f"with each backend in an autogroup of its own (this one's: {theirs.name})"
        fixes = f"Run both in one group ({autogroup_off}), or PostgreSQL in a cgroup at the highest weight ({weights})"
    elif store_top is None:
        fixes = f"Run both in one group, or PostgreSQL in a cgroup of its own at the highest weight ({weights})"
    elif not store_top[1]:
        fixes = (f"Give {store_top[0]} the highest weight ({weights}), or run both in one group "
                 f"({autogroup_off})")
    else:
        fixes = (f"{store_top[0]} and this server's {server_top[0]} both have the highest weight and meet on even "
                 f"terms: give {server_top[0]} less, or run both in one group")
    if server_highest and not store_highest:
        # Weighting the store alone would only bring the two to even terms.
        fixes += f"; this server's {server_top[0]} has the highest weight too, so give it less as well"
    return (f"the PostgreSQL store runs on this host {where}, this server in {ours.name}: beside loaded replicas, "
            "PostgreSQL in another scheduling group without the highest CPU weight waited seconds for a CPU and "
            f"most answers went out stale. {fixes}; docs/advice-service.md")
