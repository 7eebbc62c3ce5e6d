"""launchd: the LaunchAgent plist, the daemon's side of launchd's socket activation, and macOS
peer credentials.

launchd cannot run here, so what runs on macOS alone is kept to the smallest functions and
exercised through their seams: `launchd_socket` is handed a stand-in with the C signature of
launch_activate_socket(3) that passes a real listening socket in a malloc'd array (the array
handling, the free and the checks on the socket all run), and `parse_xucred` reads struct xucred
bytes laid out as <sys/ucred.h> declares them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import plistlib
import re
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from xum_client import install, units
from xumd.rpc import server
from xumd.system.platform import Platform, linux, portable

REPO = Path(__file__).resolve().parents[2]
PLIST = REPO / "systemd" / "launchd" / units.LAUNCHD_NAME
DTD = Path(__file__).with_name("plist-1.0.dtd")

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
ACTIVATE = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.POINTER(ctypes.POINTER(ctypes.c_int)),
    ctypes.POINTER(ctypes.c_size_t),
)


def test_the_repository_plist_is_the_rendered_one() -> None:
    assert PLIST.read_text() == units.render_launchd()


def test_the_plist_asks_for_socket_activation_only() -> None:
    data = plistlib.loads(PLIST.read_bytes())
    assert data["Label"] == units.LAUNCHD_LABEL
    assert data["ProgramArguments"][1:] == ["--root", "/Users/USERNAME/.local/state/xum"]
    listener = data["Sockets"][server.LAUNCHD_SOCKET]
    assert listener == {
        "SockFamily": "Unix",
        "SockType": "stream",
        "SockPathName": "/Users/USERNAME/.local/state/xum/xumd.sock",
        "SockPathMode": 0o600,
    }
    # Demand alone starts it: RunAtLoad, or KeepAlive (SuccessfulExit implies RunAtLoad), would
    # start it at login.
    assert "RunAtLoad" not in data and "KeepAlive" not in data
    rendered = plistlib.loads(units.render_launchd("/x/xumd", "/h/a & b", "/h/l.log").encode())
    assert rendered["ProgramArguments"] == ["/x/xumd", "--root", "/h/a & b"]
    assert rendered["Sockets"][server.LAUNCHD_SOCKET]["SockPathName"] == "/h/a & b/xumd.sock"


def test_the_client_and_the_daemon_name_the_same_socket() -> None:
    assert units.LAUNCHD_SOCKET == server.LAUNCHD_SOCKET


def test_the_plist_is_a_valid_property_list() -> None:
    """`plutil -lint` where it exists (macOS); elsewhere the plist DTD through xmllint, and the
    number syntax the DTD cannot express."""
    text = units.render_launchd("/x/xumd", "/h/a & b <c>", "/h/l.log")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / units.LAUNCHD_NAME
        path.write_text(text)
        if shutil.which("plutil"):
            command = ["plutil", "-lint", str(path)]
        elif shutil.which("xmllint"):
            command = ["xmllint", "--noout", "--nonet", "--dtdvalid", str(DTD), str(path)]
        else:
            pytest.skip("neither plutil nor xmllint (Debian: libxml2-utils) is installed")
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr
    for number in re.findall(r"<integer>(.*?)</integer>", text):
        assert re.fullmatch(r"[+-]?[0-9]+", number), number


def test_the_dtd_check_refuses_a_broken_plist(tmp_path: Path) -> None:
    if not shutil.which("xmllint"):
        pytest.skip("xmllint is not installed (Debian: libxml2-utils)")
    broken = tmp_path / "broken.plist"
    # A key without its value: well-formed XML, not a property list.
    broken.write_text(units.render_launchd().replace("<string>dev.xum.xumd</string>", ""))
    command = ["xmllint", "--noout", "--nonet", "--dtdvalid", str(DTD), str(broken)]
    assert subprocess.run(command, capture_output=True, timeout=30).returncode != 0


def test_install_on_macos_makes_the_private_root_launchd_binds_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    root = tmp_path / "state" / "xum"
    done = install.install(root=str(root), platform="darwin")
    plist = tmp_path / "Library" / "LaunchAgents" / units.LAUNCHD_NAME
    data = plistlib.loads(plist.read_bytes())
    assert data["Sockets"][server.LAUNCHD_SOCKET]["SockPathName"] == str(root / "xumd.sock")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert str(plist) in done["files"]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    tmp = Path(tempfile.mkdtemp(prefix="xl"))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp / "s"))
    sock.listen(4)
    try:
        yield sock
    finally:
        sock.close()
        shutil.rmtree(tmp)


class Launchd:
    """A stand-in for launch_activate_socket(3): hands out `fds` in a malloc'd array, or fails
    with `error`; records the names asked for and the arrays freed."""

    def __init__(self, fds: list[int], error: int = 0) -> None:
        self.fds = fds
        self.error = error
        self.names: list[bytes] = []
        self.arrays: list[int] = []
        self.freed: list[int] = []
        self.activate = ACTIVATE(self._activate)

    def _activate(
        self,
        name: bytes,
        fds_out: ctypes._Pointer[ctypes._Pointer[ctypes.c_int]],
        count_out: ctypes._Pointer[ctypes.c_size_t],
    ) -> int:
        self.names.append(name)
        if self.error:
            return self.error
        address = libc.malloc(ctypes.sizeof(ctypes.c_int) * len(self.fds))
        self.arrays.append(address)
        array = ctypes.cast(address, ctypes.POINTER(ctypes.c_int))
        for i, fd in enumerate(self.fds):
            array[i] = fd
        fds_out[0] = array
        count_out[0] = len(self.fds)
        return 0

    def free(self, array: ctypes._Pointer[ctypes.c_int]) -> None:
        address = ctypes.cast(array, ctypes.c_void_p).value
        assert address is not None
        self.freed.append(address)
        libc.free(address)


def test_launchd_socket_takes_the_listener_launchd_passed(listener: socket.socket) -> None:
    fd = os.dup(listener.fileno())
    os.set_inheritable(fd, True)
    launchd = Launchd([fd])
    sock = server.launchd_socket(launchd.activate, launchd.free)
    assert sock is not None
    with sock:
        assert launchd.names == [b"Listeners"]
        assert launchd.freed == launchd.arrays and len(launchd.arrays) == 1
        assert sock.fileno() == fd
        assert not os.get_inheritable(fd)  # not passed on to the daemon's children
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(listener.getsockname())
            accepted, _ = sock.accept()
            accepted.close()


def test_launchd_socket_closes_descriptors_beyond_the_first(listener: socket.socket) -> None:
    first, extra = os.dup(listener.fileno()), os.dup(listener.fileno())
    launchd = Launchd([first, extra])
    sock = server.launchd_socket(launchd.activate, launchd.free)
    assert sock is not None
    with sock:
        assert sock.fileno() == first
        with pytest.raises(OSError) as closed:
            os.fstat(extra)
        assert closed.value.errno == errno.EBADF
        assert launchd.freed == launchd.arrays


@pytest.mark.parametrize("error", [errno.ESRCH, errno.ENOENT])
def test_not_started_by_launchd_means_bind_our_own(error: int) -> None:
    """ESRCH: not a launchd job (run by hand); ENOENT: a plist without the socket."""
    launchd = Launchd([], error=error)
    assert server.launchd_socket(launchd.activate, launchd.free) is None
    assert launchd.names == [b"Listeners"] and launchd.freed == []


def test_a_second_activation_fails_set_up() -> None:
    launchd = Launchd([], error=errno.EALREADY)
    with pytest.raises(server.SocketSetupError, match="launch_activate_socket"):
        server.launchd_socket(launchd.activate, launchd.free)


def test_a_passed_socket_that_does_not_listen_fails_set_up() -> None:
    unbound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    launchd = Launchd([os.dup(unbound.fileno())])
    unbound.close()
    with pytest.raises(server.SocketSetupError, match="launchd passed a socket that is not"):
        server.launchd_socket(launchd.activate, launchd.free)
    assert launchd.freed == launchd.arrays


def test_off_macos_nothing_is_asked_of_launchd() -> None:
    assert server.launchd_socket() is None


def xucred(version: int, uid: int, groups: list[int]) -> bytes:
    # <sys/ucred.h>: u_int cr_version; uid_t cr_uid; short cr_ngroups; gid_t cr_groups[16],
    # the short padded to the next 4-byte boundary.
    padded = groups + [0] * (16 - len(groups))
    raw = version.to_bytes(4, "little") + uid.to_bytes(4, "little")
    raw += len(groups).to_bytes(2, "little") + b"\0\0"
    return raw + b"".join(g.to_bytes(4, "little") for g in padded)


def test_xucred_gives_the_uid_and_the_first_group() -> None:
    raw = xucred(0, 501, [20, 12, 61])
    assert len(raw) == portable.XUCRED.size == 76  # sizeof(struct xucred) on macOS
    assert portable.parse_xucred(raw) == (501, 20)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (xucred(1, 501, [20]), "version 1"),
        (xucred(0, 501, []), "0 groups"),
        (xucred(0, 501, [20])[:40], "of 40 bytes"),
    ],
)
def test_an_xucred_this_code_does_not_know_is_refused(raw: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        portable.parse_xucred(raw)


@pytest.mark.parametrize("backend", [linux, portable])
def test_peer_credentials_on_linux_are_the_peers(backend: Platform) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert server.peer_credentials(a) == backend.peer_credentials(a)
        assert backend.peer_credentials(a) == (os.getpid(), os.getuid(), os.getgid())
