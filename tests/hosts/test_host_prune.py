"""`xum host install` prunes the host's older environments (xum_client.hostprune, the code the
install script runs there): never the one the link points at, never one made by hand, never one
a process still uses. Real directories and real processes; the whole install through a real
sshd is tests/hosts/test_host_install.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from xum_client import hostinstall
from xum_client.hostprune import MARKER, filesystem_of, prune, shared_filesystem, user_of


def make_venv(venvs: Path, name: str, *, ours: bool = True) -> Path:
    path = venvs / name
    (path / "bin").mkdir(parents=True)
    (path / "lib").mkdir()
    if ours:
        (path / MARKER).write_text("0.1.0\n")
    return path


@contextmanager
def running(argv: list[str], stdin_text: str = "") -> Iterator[subprocess.Popen[str]]:
    """A real process that says `ready` once set up, and runs until its stdin closes."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(stdin_text)
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(30)


# Reads a path from stdin (so it is not on its command line), maps that file, says ready.
MAPPER = (
    "import mmap, sys; path = sys.stdin.readline().strip(); f = open(path, 'rb'); "
    "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); print('ready', flush=True); "
    "sys.stdin.read()"
)


def test_only_unused_environments_made_by_install_are_removed(tmp_short: Path) -> None:
    venvs = tmp_short / "venvs"
    current = make_venv(venvs, "0.2.0-cur")
    old = make_venv(venvs, "0.1.0-old")
    older = make_venv(venvs, "0.0.9-older")
    by_hand = make_venv(venvs, "mine", ours=False)
    (venvs / "alias").symlink_to(old)
    crashed = make_venv(venvs, ".prune-0.0.8-x")
    result = prune(str(venvs), str(current))
    assert result["pruned"] == [str(older), str(old)]
    assert result["kept"] == [str(venvs / "alias"), str(by_hand)]
    why = result["why"]
    assert isinstance(why, dict)
    assert why[str(by_hand)] == f"not made by xum host install (no {MARKER})"
    assert not old.exists() and not older.exists() and not crashed.exists()
    assert current.is_dir() and by_hand.is_dir()
    assert sorted(p.name for p in venvs.iterdir()) == ["0.2.0-cur", "alias", "mine"]


def test_an_environment_a_process_runs_from_is_kept(tmp_short: Path) -> None:
    """A daemon started through the link runs its entry script's `#!` interpreter: the
    environment's real path is on its command line."""
    venvs = tmp_short / "venvs"
    current = make_venv(venvs, "0.2.0-cur")
    old = make_venv(venvs, "0.1.0-old")
    interpreter = old / "bin" / "python"
    interpreter.symlink_to(sys.executable)
    ready = "import sys; print('ready', flush=True); sys.stdin.read()"
    with running([str(interpreter), "-c", ready]) as proc:
        assert user_of(str(old)) == proc.pid
        result = prune(str(venvs), str(current))
        assert result["pruned"] == [] and result["kept"] == [str(old)]
        assert result["why"] == {str(old): f"in use by process {proc.pid}"}
        assert (old / MARKER).is_file()
    # Once it has ended, the next install removes it.
    assert prune(str(venvs), str(current))["pruned"] == [str(old)]
    assert not old.exists()


def test_an_environment_whose_file_a_process_maps_is_kept(tmp_short: Path) -> None:
    """An extension module loaded from the environment (a mapping), with no trace of it on the
    process's command line."""
    venvs = tmp_short / "venvs"
    current = make_venv(venvs, "0.2.0-cur")
    old = make_venv(venvs, "0.1.0-old")
    module = old / "lib" / "_ext.so"
    module.write_bytes(b"\0" * 4096)
    with running([sys.executable, "-c", MAPPER], f"{module}\n") as proc:
        assert user_of(str(old)) == proc.pid
        assert prune(str(venvs), str(current))["kept"] == [str(old)]
    assert user_of(str(old)) is None


def test_a_prefix_is_not_a_parent(tmp_short: Path) -> None:
    """A process under `0.1.0-old2` does not hold `0.1.0-old`."""
    venvs = tmp_short / "venvs"
    current = make_venv(venvs, "0.2.0-cur")
    old = make_venv(venvs, "0.1.0-old")
    sibling = make_venv(venvs, "0.1.0-old2")
    interpreter = sibling / "bin" / "python"
    interpreter.symlink_to(sys.executable)
    ready = "import sys; print('ready', flush=True); sys.stdin.read()"
    with running([str(interpreter), "-c", ready]):
        result = prune(str(venvs), str(current))
    assert result["pruned"] == [str(old)] and result["kept"] == [str(sibling)]


def test_the_filesystem_of_a_path_is_its_longest_mount() -> None:
    table = "\n".join(
        [
            "22 1 0:21 / / rw - ext4 /dev/sda1 rw",
            "23 22 0:22 / /home rw - nfs4 srv:/home rw",
            "24 23 0:23 / /home/me\\040x/fast rw - tmpfs tmpfs rw",
            "25 22 0:24 / /mnt/box rw - fuse.sshfs me@box: rw",
            "not a mountinfo line",
        ]
    )
    assert filesystem_of("/home/me/.local/share/xum/venvs", table) == "nfs4"
    assert filesystem_of("/home/me x/fast/venvs", table) == "tmpfs"  # an escaped space
    assert filesystem_of("/home/me x/fastest", table) == "nfs4"  # a prefix, not a parent
    assert filesystem_of("/mnt/box/xum", table) == "fuse.sshfs"
    assert filesystem_of("/srv", table) == "ext4"
    assert filesystem_of("/srv", "") is None


def test_on_a_shared_filesystem_nothing_is_removed(tmp_short: Path) -> None:
    """A home shared by several machines (NFS): a process on another one is not in this /proc,
    so no environment is removed there. The mount table says where `venvs` is: this one puts
    it on NFS (a real network mount cannot be made here); an unreadable one is fail-closed."""
    venvs = tmp_short / "venvs"
    current = make_venv(venvs, "0.2.0-cur")
    old = make_venv(venvs, "0.1.0-old")
    mountinfo = tmp_short / "mountinfo"
    mountinfo.write_text(
        f"22 1 0:21 / / rw - ext4 /dev/sda1 rw\n23 22 0:22 / {venvs} rw - nfs4 srv:/v rw\n"
    )
    assert shared_filesystem(str(venvs), str(mountinfo)) == "nfs4"
    result = prune(str(venvs), str(current), str(mountinfo))
    assert result["pruned"] == [] and result["kept"] == [str(old)]
    assert result["why"] == {
        str(old): "on a nfs4 filesystem: a process on another machine may use it"
    }
    missing = str(tmp_short / "no-mountinfo")
    assert prune(str(venvs), str(current), missing)["kept"] == [str(old)]
    assert old.is_dir()
    # This machine's own mount table (the temp directory is local): removed.
    assert shared_filesystem(str(venvs)) is None
    assert prune(str(venvs), str(current))["pruned"] == [str(old)]


def test_the_install_script_carries_the_prune_code() -> None:
    """The host runs one script: hostprune's source, then the install; it compiles whole."""
    script = hostinstall._install_script()
    assert script.startswith(Path(hostinstall.__file__).with_name("hostprune.py").read_text())
    compile(script, "<install>", "exec")
    assert "prune(venvs, installed)" in script


def test_a_missing_prune_module_is_a_clear_error(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installation missing hostprune.py (damaged): one line, before anything is copied."""
    monkeypatch.setattr(hostinstall, "__file__", str(tmp_short / "hostinstall.py"))
    with pytest.raises(hostinstall.HostInstallError) as caught:
        hostinstall._install_script()
    assert str(caught.value).startswith(f"cannot read {tmp_short / 'hostprune.py'} to ship")
    assert str(caught.value).endswith(": reinstall xum here")
