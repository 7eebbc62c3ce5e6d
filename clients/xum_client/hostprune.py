"""Pruning the host's older xum environments after `xum host install` moved its link.

This file is shipped to the host as source and run there by the install script (under the
host's Python >= 3.11, stdlib only, no import of xum: the host may have none yet), after the
link `xum/venv` points at the new environment. It is a module of its own so that the tests can
run the very same code here, against real processes.

An environment under `xum/venvs/` is removed only when all of these hold:
- `xum host install` made it: it holds MARKER, written there before anything was installed in
  it (a directory made by hand, or by an install older than the marker, is kept);
- it is not the one the link now points at;
- no process uses it: none has a path inside it as a word of its command line (the entry
  scripts' `#!` names the environment's own interpreter, so a daemon or a bridge started
  through the link shows its real path there), as its executable, or in its memory maps (a
  loaded extension module). That is read from /proc: where /proc cannot be read, nothing is
  removed (fail closed).
- the environments are not on a network or FUSE filesystem (NFS, CIFS, sshfs, ...): a home
  directory shared by several machines shares `xum/venvs/` too, and a process on another machine
  is not in this one's /proc. There, nothing is removed (each is kept, saying why).
Removal renames the directory to `.prune-<name>` first (one atomic step: no half-removed
environment is left under a name that looks usable), then deletes it; a `.prune-*` left by a
crash is deleted on the next run.
"""

from __future__ import annotations

import os
import shutil

MARKER = ".xum-host-install"
"""The file `xum host install` writes into each environment it makes."""
PRUNING = ".prune-"


SHARED_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ncpfs",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "9p",
        "virtiofs",
        "orangefs",
        "ocfs2",
        "gfs2",
    }
)
"""Filesystem types another machine may have mounted too (and every FUSE one: sshfs, ...)."""
MOUNTINFO = "/proc/self/mountinfo"


def _unescape(field: str) -> str:
    # mountinfo escapes a space, a tab, a newline and a backslash as \040, \011, \012, \134.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def filesystem_of(path: str, mountinfo: str) -> str | None:
    """The type of the filesystem `path` (absolute, symlinks resolved) is on, by the text of a
    mountinfo file (the mount whose point is the longest prefix of `path`); None if no line
    names one."""
    best, kind = -1, None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        point = _unescape(fields[4])
        inside = point in ("/", path) or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), right.split()[0]
    return kind


def shared_filesystem(path: str, mountinfo_path: str = MOUNTINFO) -> str | None:
    """Why `path` may be seen by other machines (its filesystem's type), or None when it is
    local; a mount table that cannot be read counts as shared (fail closed)."""
    try:
        with open(mountinfo_path, encoding="utf-8", errors="replace") as handle:
            kind = filesystem_of(os.path.realpath(path), handle.read())
    except OSError:
        return "unknown"
    if kind is None:
        return "unknown"
    if kind in SHARED_FILESYSTEMS or kind == "fuse" or kind.startswith("fuse."):
        return kind
    return None


def user_of(path: str) -> int | None:
    """The pid of a process that uses something under `path`, or None; -1 when it cannot be
    told (no /proc)."""
    prefix = os.path.join(path, "")
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return -1
    if not os.path.isdir("/proc/self"):
        return -1
    for pid in pids:
        base = os.path.join("/proc", pid)
        try:
            with open(os.path.join(base, "cmdline"), "rb") as handle:
                words = handle.read().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        if any(os.fsdecode(word).startswith(prefix) for word in words):
            return int(pid)
        try:
            if os.readlink(os.path.join(base, "exe")).startswith(prefix):
                return int(pid)
        except OSError:
            pass
        try:
            with open(os.path.join(base, "maps"), encoding="utf-8", errors="replace") as handle:
                if any(prefix in line for line in handle):
                    return int(pid)
        except OSError:
            pass
    return None


def prune(venvs: str, current: str, mountinfo_path: str = MOUNTINFO) -> dict[str, object]:
    """Remove the environments under `venvs` that the rules above allow; `current` is the one
    the link points at. Returns `{"pruned": [paths], "kept": [paths], "why": {path: reason}}`."""
    pruned: list[str] = []
    kept: list[str] = []
    why: dict[str, str] = {}
    current = os.path.realpath(current)
    shared = shared_filesystem(venvs, mountinfo_path)
    for name in sorted(os.listdir(venvs)):
        path = os.path.join(venvs, name)
        if name.startswith(PRUNING):
            # A removal a crash interrupted: already renamed away, nothing can run from it.
            shutil.rmtree(path, ignore_errors=True)
            continue
        if os.path.realpath(path) == current:
            continue
        if shared is not None:
            reason = f"on a {shared} filesystem: a process on another machine may use it"
        elif os.path.islink(path) or not os.path.isdir(path):
            reason = "not a directory made by xum host install"
        elif not os.path.isfile(os.path.join(path, MARKER)):
            reason = "not made by xum host install (no " + MARKER + ")"
        else:
            pid = user_of(path)
            if pid == -1:
                reason = "cannot tell whether a process uses it (no /proc)"
            elif pid is not None:
                reason = "in use by process " + str(pid)
            else:
                reason = ""
        if reason:
            kept.append(path)
            why[path] = reason
            continue
        doomed = os.path.join(venvs, PRUNING + name)
        try:
            os.rename(path, doomed)
        except OSError as exc:
            kept.append(path)
            why[path] = "cannot remove: " + (exc.strerror or str(exc))
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        pruned.append(path)
    return {"pruned": pruned, "kept": kept, "why": why}
