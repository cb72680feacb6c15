"""Which network namespaces are alive, by cookie (``SO_NETNS_COOKIE``): those a task, an open file or a mount holds.

The kernel offers no list of network namespaces, and this kernel (6.18, no nsfs file handles) no lookup of one by
its cookie, so they are found through what holds them: every task's ``ns/net`` (threads may differ from their
process), every open ``net:[...]`` namespace file and every socket (a socket keeps its namespace alive after its
process has moved to another), and every nsfs bind mount of every mount namespace a process is in (``ip netns
add``'s under /run/netns, a container runtime's elsewhere). Each namespace's cookie is read as the kernel gives it
to the tame program: from a socket created inside it (``setns`` in a thread of its own) or from the socket found.

A task whose namespace cannot be told (this process outside the initial PID namespace, a task whose /proc
entries cannot be read and whose namespace no other holder shows) makes it judge nothing
(:class:`CcLivenessUnknown`). A task root may not inspect (undumpable, or guarded by a security module) is known
by the inode of its /proc/PID/net, but its open files are not seen: such processes are named to the caller. Two
holders it does not look at remain: a namespace held only by a socket already closed by its process (TCP still
sending its last data) or by a namespace file in flight in a unix socket, and a mount namespace no process is in.
A namespace that moves from one holder to another while they are read could be missed once, so a cookie is
called gone only when two readings in a row miss it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import socket
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

from probes.errors import CcLivenessUnknown

SO_NETNS_COOKIE = 71
"""getsockopt(SOL_SOCKET, SO_NETNS_COOKIE): the u64 cookie of a socket's network namespace (Linux 5.14)."""
CLONE_NEWNET = 0x40000000
PROC_PID_INIT_INO = 0xEFFFFFFC
"""The inode of the initial PID namespace's ``ns/pid`` (include/linux/proc_ns.h)."""
SYS_PIDFD_GETFD = 438
"""pidfd_getfd(2), one number on every architecture (Linux 5.6)."""
NAMED = Path("/run/netns")

_libc = ctypes.CDLL(None, use_errno=True)
_GONE = (errno.ENOENT, errno.ESRCH, errno.EBADF)  # the process or its file went while being read: it holds nothing


def socket_cookie(sock: socket.socket) -> int:
    """The cookie of ``sock``'s network namespace."""
    return struct.unpack("<Q", sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8))[0]


@dataclass
class _Holders:
    """What one reading of /proc found: the namespace files to enter ({inode: path}), the /proc/PID/net inodes of
    tasks whose namespace file may not be read, and every open socket as (pid, fd)."""

    files: dict[int, str] = field(default_factory=dict)
    unreadable_tasks: dict[int, str] = field(default_factory=dict)  # /proc net inode -> the task's /proc path
    sockets: list[tuple[int, int]] = field(default_factory=list)
    unreadable_files: list[int] = field(default_factory=list)  # pids whose open files may not be read


def _enter_each(paths: dict[int, str]) -> tuple[set[int], set[int]]:
    """The cookies of the namespaces behind ``paths`` and their /proc/net inodes, each read from inside it by a
    thread that enters it (setns moves only the calling thread; the thread then ends)."""
    cookies: set[int] = set()
    proc_inodes: set[int] = set()
    failed: list[str] = []

    def enter_each() -> None:
        for path in paths.values():
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno not in _GONE:
                    failed.append(f"{path}: {exc.strerror}")
                continue
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    failed.append(f"setns {path}: {os.strerror(ctypes.get_errno())}")
                    continue
            finally:
                os.close(fd)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                cookies.add(socket_cookie(sock))
            proc_inodes.add(os.stat("/proc/thread-self/net/dev").st_ino)

    worker = threading.Thread(target=enter_each, name="netns-cookies", daemon=True)
    worker.start()
    worker.join()
    if failed:
        raise CcLivenessUnknown(f"cannot read the cookie of every live network namespace ({'; '.join(failed[:3])})")
    return cookies, proc_inodes


_OCTAL = re.compile(r"\\([0-7]{3})")
_DENIED = (errno.EACCES, errno.EPERM)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _holders() -> _Holders:
    """Every holder of a network namespace that /proc shows: tasks, open namespace files and sockets, nsfs mounts
    (and ``ip netns``'s names)."""
    found = _Holders()
    mount_views: set[tuple[str, ...]] = set()  # a mount table read once, whichever process shows it

    def add(path: str) -> None:
        try:
            found.files.setdefault(os.stat(path).st_ino, path)
        except OSError as exc:
            if exc.errno not in _GONE:
                raise CcLivenessUnknown(f"cannot read {path}: {exc.strerror}") from exc

    for entry in (NAMED.iterdir() if NAMED.is_dir() else []):
        add(str(entry))
    for pid in _pids():
        proc = f"/proc/{pid}"
        try:
            tasks = os.listdir(f"{proc}/task")
        except OSError as exc:
            if exc.errno in _GONE:
                continue
            raise CcLivenessUnknown(f"cannot read {proc}: {exc.strerror}") from exc
        view = _mount_view(proc, tasks)
        for tid in tasks:
            task = f"{proc}/task/{tid}"
            try:
                found.files.setdefault(os.stat(f"{task}/ns/net").st_ino, f"{task}/ns/net")
            except OSError as exc:
                if exc.errno in _GONE:
                    continue
                if exc.errno not in _DENIED:
                    raise CcLivenessUnknown(f"cannot read {task}/ns/net: {exc.strerror}") from exc
                # A task root may not inspect (a protected or undumpable one): its namespace is known by the inode
                # its /proc/PID/net shows, which is that namespace's own.
                try:
                    found.unreadable_tasks[os.stat(f"{task}/net/dev").st_ino] = task
                except OSError as exc2:
                    if exc2.errno not in _GONE:
                        raise CcLivenessUnknown(f"cannot tell the network namespace of {task}: {exc2.strerror}") \
                            from exc2
        try:
            fds = os.listdir(f"{proc}/fd")
        except OSError as exc:
            if exc.errno in _GONE:
                continue
            raise CcLivenessUnknown(f"cannot read {proc}/fd: {exc.strerror}") from exc
        for fd in fds:
            try:
                target = os.readlink(f"{proc}/fd/{fd}")
            except OSError as exc:
                if exc.errno in _GONE:
                    continue
                if exc.errno in _DENIED:
                    found.unreadable_files.append(pid)
                    break
                raise CcLivenessUnknown(f"cannot read {proc}/fd/{fd}: {exc.strerror}") from exc
            if target.startswith("net:["):
                add(f"{proc}/fd/{fd}")
            elif target.startswith("socket:["):
                found.sockets.append((pid, int(fd)))
        if view is None:
            continue
        seen_from, mountinfo = view
        mounts = tuple(line for line in mountinfo.splitlines() if " - nsfs " in line)
        if mounts in mount_views:
            continue
        mount_views.add(mounts)
        for line in mounts:
            # mountinfo(5): ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER; the
            # ROOT of an nsfs mount names the namespace (net:[INODE]).
            fields = line.split()
            held = re.fullmatch(r"net:\[(\d+)\]", fields[3])
            if held is None or int(held.group(1)) in found.files:
                continue
            mountpoint = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4])  # \040 for a space
            add(f"{seen_from}/root{mountpoint}")
    return found


def _mount_view(proc: str, tasks: list[str]) -> tuple[str, str] | None:
    """(the /proc directory its mounts are seen from, their mountinfo) of process ``proc``: its own or, while its first
    thread is exiting (a zombie, or a leader gone before its threads: EINVAL, no mount namespace left), a live
    thread's; None when every thread is exiting or gone (it holds no mount)."""
    for seen_from in (proc, *(f"{proc}/task/{tid}" for tid in tasks)):
        try:
            return seen_from, Path(f"{seen_from}/mountinfo").read_text()
        except OSError as exc:
            if exc.errno not in (*_GONE, errno.EINVAL):
                raise CcLivenessUnknown(f"cannot read {seen_from}/mountinfo: {exc.strerror}") from exc
    return None


def _socket_cookies(sockets: list[tuple[int, int]], wanted: set[int]) -> set[int]:
    """The cookies among ``wanted`` that a socket of ``sockets`` ((pid, fd)) is in, each read from a copy of the
    socket (pidfd_getfd); stops once every wanted one is found."""
    found: set[int] = set()
    pidfds: dict[int, int | None] = {}
    try:
        for pid, fd in sockets:
            if found >= wanted:
                break
            if pid not in pidfds:
                try:
                    pidfds[pid] = os.pidfd_open(pid)
                except OSError as exc:
                    if exc.errno not in _GONE:
                        raise CcLivenessUnknown(f"cannot open process {pid}: {exc.strerror}") from exc
                    pidfds[pid] = None
            pidfd = pidfds[pid]
            if pidfd is None:
                continue
            copy = _libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
            if copy < 0:
                err = ctypes.get_errno()
                if err in _GONE:
                    continue
                raise CcLivenessUnknown(f"cannot read socket {fd} of process {pid}: {os.strerror(err)}")
            try:
                with socket.socket(fileno=copy) as sock:
                    found.add(socket_cookie(sock))
            except OSError as exc:
                raise CcLivenessUnknown(f"cannot read socket {fd} of process {pid}'s namespace: {exc.strerror}") \
                    from exc
    finally:
        for pidfd in pidfds.values():
            if pidfd is not None:
                os.close(pidfd)
    return found


def _reading(candidates: set[int]) -> tuple[set[int], list[int]]:
    """The cookies of ``candidates`` that belong to a live network namespace, in one reading of the holders, and the
    processes whose open files could not be read."""
    found = _holders()
    live, proc_inodes = _enter_each(found.files)
    unknown = set(found.unreadable_tasks) - proc_inodes
    if unknown:
        raise CcLivenessUnknown(f"cannot read the network namespace of {found.unreadable_tasks[min(unknown)]}, which "
                                "no other holder shows")
    live &= candidates
    return live | _socket_cookies(found.sockets, candidates - live), found.unreadable_files


def gone(cookies: set[int] | frozenset[int]) -> tuple[set[int], list[int]]:
    """Those of ``cookies`` whose network namespace no longer exists (cookies are never reused), and the processes
    whose open files (sockets, namespace files) could not be read, which may hold one of them. Raises
    CcLivenessUnknown when not every task's namespace can be told: then nothing can be called gone."""
    if os.stat("/proc/self/ns/pid").st_ino != PROC_PID_INIT_INO:
        raise CcLivenessUnknown("this process is not in the initial PID namespace, so /proc does not show every "
                                "process that may hold a network namespace: run it on the host")
    missing, unreadable = set(cookies), set()
    for _ in range(2):
        live, unread = _reading(missing)
        missing -= live
        unreadable.update(unread)
        if not missing:
            break
    return missing, sorted(unreadable)
