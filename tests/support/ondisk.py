"""The bytes on disk as a test reads them: every entry of a tree by descriptor (a path beyond
PATH_MAX too), and such a path made for real."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path


def disk(path: Path) -> dict[str, tuple[str, str]]:
    """Every entry under `path` (`.git` of the top aside) as (kind, bytes' digest or link
    target), walked by descriptor so a path beyond PATH_MAX counts too."""
    found: dict[str, tuple[str, str]] = {}
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    stack = [(os.open(path, flags), "")]
    while stack:
        fd, rel = stack.pop()
        try:
            with os.scandir(fd) as it:
                entries = list(it)
            for e in entries:
                child = f"{rel}/{e.name}" if rel else e.name
                if child in (".git", ".xum"):
                    continue
                st = os.stat(e.name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    found[child] = ("dir", "")
                    stack.append((os.open(e.name, flags, dir_fd=fd), child))
                elif stat.S_ISLNK(st.st_mode):
                    found[child] = ("link", os.readlink(e.name, dir_fd=fd))
                else:
                    f = os.open(e.name, os.O_RDONLY, dir_fd=fd)
                    try:
                        data = b""
                        while chunk := os.read(f, 1 << 20):
                            data += chunk
                    finally:
                        os.close(f)
                    x = "x" if st.st_mode & stat.S_IXUSR else "-"
                    found[child] = (f"file{x}", hashlib.sha256(data).hexdigest())
        finally:
            os.close(fd)
    return found


def deep_dir(top: Path, total: int) -> list[str]:
    """Directory names whose chain under `top` is longer than `total` bytes."""
    names: list[str] = []
    while len(str(top)) + sum(len(n) + 1 for n in names) <= total:
        names.append("d" * 200)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for name in names:
        os.mkdir(name, dir_fd=fd)
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    f = os.open("deep.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(f, b"beyond PATH_MAX\n")
    os.close(f)
    os.close(fd)
    return names
