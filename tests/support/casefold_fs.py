"""A real case-insensitive filesystem for the aliasing tests: what APFS and NTFS do by default
(case-preserving, case-insensitive), on Linux.

Where the kernel has ext4's `casefold` feature, an ext4 image on a loop device with a casefolded
directory (`chattr +F`) is used. Elsewhere (this machine's kernel has no vfat, no ext4 casefold
and no XFS ascii-ci, but has FUSE), `CaseFolding`, a passthrough FUSE filesystem (mfusepy on
libfuse 3) over a backing directory, resolves every path component case-insensitively: an exact
name first, else the one entry of the directory whose name is equal ignoring case. It reports
the backing inode numbers (`use_ino`), so two spellings of one file have one (st_dev, st_ino),
and caches no name in the kernel (entry, negative and attribute timeouts 0), so a rename or
removal through one spelling is seen at once through every other.

`python -m tests.support.casefold_fs BACKING MOUNTPOINT` serves in the foreground until
unmounted; `case_insensitive_dir` runs it as a subprocess for a test, unmounts it with
`fusermount3 -u` at the end, and skips the test, saying why, where neither can be mounted.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.tmpfs import mounted
from tests.support.wait import until

MOUNT_S = 20.0


def _fold(name: str) -> str:
    return name.casefold()


class CaseFolding:
    """The FUSE operations: every path is resolved against `backing`, component by component,
    ignoring case; what does not exist yet keeps the spelling it was given."""

    use_ns = True

    def __init__(self, backing: str) -> None:
        self.backing = os.path.realpath(backing)
        # Renames and creations resolve and then act: one at a time, so two spellings of one
        # new name cannot both be created.
        self._names = threading.RLock()

    # -- resolution ------------------------------------------------------------------------------

    def _entry(self, directory: str, name: str) -> str | None:
        """The name under which `name` exists in the backing `directory`, ignoring case."""
        if os.path.lexists(os.path.join(directory, name)):
            return name
        try:
            names = os.listdir(directory)
        except OSError:
            return None
        folded = _fold(name)
        for entry in names:
            if _fold(entry) == folded:
                return entry
        return None

    def _real(self, path: str) -> str:
        """The backing path of `path`: existing components in their stored spelling, the rest
        (at most the last, for a creation) as given."""
        current = self.backing
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            found = self._entry(current, part)
            if found is None:
                if i != len(parts) - 1:
                    raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), path)
                found = part
            current = os.path.join(current, found)
        return current

    # -- metadata -----------------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.fstat(fh) if fh is not None else os.lstat(self._real(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino", "st_dev")
        attrs: dict[str, Any] = {k: getattr(st, k) for k in keys}
        for which in ("atime", "mtime", "ctime"):
            attrs[f"st_{which}"] = getattr(st, f"st_{which}_ns")
        attrs["st_blocks"] = st.st_blocks
        return attrs

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.lchown(self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._real(path), follow_symlinks=False)
        else:
            os.utime(self._real(path), ns=times, follow_symlinks=False)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files")
        return {k: getattr(sv, k) for k in (*keys, "f_flag", "f_frsize", "f_namemax")}

    # -- names ------------------------------------------------------------------------------------

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        # With use_ino each entry carries its inode number: one of 0 is skipped by readdir(3).
        real = self._real(path)
        entries = []
        for name in (".", "..", *os.listdir(real)):
            st = os.lstat(os.path.join(real, name))
            entries.append((name, {"st_mode": st.st_mode, "st_ino": st.st_ino}, 0))
        return entries

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def mkdir(self, path: str, mode: int) -> int:
        with self._names:
            os.mkdir(self._real(path), mode)  # an existing name in another case: EEXIST
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._real(path))
        return 0

    def symlink(self, target: str, source: str) -> int:
        with self._names:
            os.symlink(source, self._real(target))
        return 0

    def link(self, target: str, source: str) -> int:
        with self._names:
            os.link(self._real(source), self._real(target))
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._names:
            src = self._real(old)
            dst = self._real(new)
            given = os.path.join(os.path.dirname(dst), os.path.basename(new))
            if os.path.lexists(dst) and os.path.samestat(os.lstat(src), os.lstat(dst)):
                # A case-only rename of one entry: it takes the new spelling.
                os.rename(src, given)
                return 0
            os.rename(src, dst)
            if dst != given:
                os.rename(dst, given)  # it replaced an entry spelled otherwise: keep the new name
        return 0

    def mknod(self, path: str, mode: int, dev: int) -> int:
        with self._names:
            os.mknod(self._real(path), mode, dev)
        return 0

    # -- contents ---------------------------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        return os.open(self._real(path), flags)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self._names:
            return os.open(self._real(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._real(path), length)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0


def serve(backing: str, mountpoint: str) -> None:
    import mfusepy

    class Operations(CaseFolding, mfusepy.Operations):
        pass

    mfusepy.FUSE(
        Operations(backing),
        mountpoint,
        foreground=True,
        use_ino=True,
        entry_timeout=0,
        negative_timeout=0,
        attr_timeout=0,
        fsname="casefold",
        subtype="casefold",
    )


def _is_mounted(mountpoint: Path) -> bool:
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        return any(line.split()[4] == target for line in table)


@contextmanager
def fuse_mount(backing: Path, mountpoint: Path) -> Iterator[Path]:
    """`CaseFolding` over `backing`, mounted at `mountpoint` by a subprocess; skip where FUSE
    cannot mount (no /dev/fuse, no libfuse, no fusermount3, no mfusepy)."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse: FUSE is not available in this kernel or container")
    if shutil.which("fusermount3") is None:
        pytest.skip("fusermount3 is not installed (Debian: fuse3, libfuse3-3)")
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        pytest.skip(f"mfusepy or libfuse cannot be loaded: {exc}")
    backing.mkdir(parents=True, exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.casefold_fs", str(backing), str(mountpoint)],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        try:
            until(
                lambda: _is_mounted(mountpoint) or proc.poll() is not None,
                timeout=MOUNT_S,
                message=f"the case-folding FUSE filesystem on {mountpoint}",
            )
        except AssertionError:
            pytest.skip(f"the case-folding FUSE filesystem did not mount in {MOUNT_S}s")
        if not _is_mounted(mountpoint):
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            pytest.skip(f"the case-folding FUSE filesystem cannot mount here: {out.strip()}")
        yield mountpoint
    finally:
        if _is_mounted(mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
        try:
            proc.wait(timeout=MOUNT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def _ext4_casefold_available() -> bool:
    return (
        os.geteuid() == 0
        and os.path.exists("/sys/fs/ext4/features/casefold")
        and shutil.which("mkfs.ext4") is not None
        and shutil.which("chattr") is not None
    )


@contextmanager
def ext4_casefold(base: Path) -> Iterator[Path]:
    """A casefolded directory on an ext4 image (mkfs.ext4 -O casefold; chattr +F)."""
    image = base / "ext4.img"
    mount = base / "ext4"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    made = subprocess.run(
        ["mkfs.ext4", "-q", "-O", "casefold", str(image)], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 -O casefold failed: {made.stderr.strip()}")
    try:
        with mounted(["mount", "-o", "loop", str(image), str(mount)], mount, "an ext4 image"):
            folded = mount / "ci"
            folded.mkdir()
            subprocess.run(["chattr", "+F", str(folded)], check=True)
            yield folded
    finally:
        image.unlink(missing_ok=True)


@contextmanager
def case_insensitive_dir(base: Path) -> Iterator[Path]:
    """A directory whose names are case-insensitive and case-preserving (mounted under `base`,
    which should be a short path of the test's own)."""
    if _ext4_casefold_available():
        with ext4_casefold(base) as folded:
            yield folded
        return
    with fuse_mount(base / "backing", base / "ci") as mountpoint:
        yield mountpoint


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
