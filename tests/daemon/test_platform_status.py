"""daemon.status names the platform backend in use and what it cannot guarantee
(details.platform, the protocol's PlatformStatus); XUM_PLATFORM picks the backend, and a value
that names none is a start-up error, never a silent default."""

from __future__ import annotations

import pytest
from xum_protocol.models.daemon import PlatformStatus
from xumd.startup.runner import EXIT_SETUP
from xumd.system import platform
from xumd.system.platform import linux, portable

from tests.support.daemon import DaemonProcess, short_tmpdir


@pytest.mark.parametrize("backend", ["linux", "portable"])
def test_daemon_status_names_the_backend_and_what_it_cannot_guarantee(backend: str) -> None:
    root = short_tmpdir()
    daemon = DaemonProcess(root / "r", env={platform.ENV: backend}).start()
    try:
        shown = daemon.call("daemon.status")["details"]["platform"]
        daemon.call("project.list")  # every feature built: the same answer
        assert daemon.call("daemon.status")["details"]["platform"] == shown
    finally:
        daemon.close()
    assert PlatformStatus.model_validate(shown).model_dump(mode="json") == shown
    assert shown["backend"] == backend
    if backend == "linux":
        assert shown["weaker"] == []
    else:
        assert shown["weaker"] == list(portable.WEAKER)
        assert any("subreaper" in line for line in shown["weaker"])


def test_an_unknown_backend_is_a_start_up_error() -> None:
    root = short_tmpdir()
    daemon = DaemonProcess(root / "r", env={platform.ENV: "solaris"}).start(wait_ready=False)
    try:
        assert daemon.wait() == EXIT_SETUP
        assert "XUM_PLATFORM='solaris' names no platform backend" in daemon.log_text()
    finally:
        daemon.close()


def test_the_choice_by_system_and_request() -> None:
    assert platform.choose(None, "linux") == "linux"
    assert platform.choose("", "linux") == "linux"
    assert platform.choose(None, "darwin") == "portable"
    assert platform.choose(None, "freebsd14") == "portable"
    assert platform.choose("portable", "linux") == "portable"
    with pytest.raises(platform.PlatformError, match="needs Linux"):
        platform.choose("linux", "darwin")
    with pytest.raises(platform.PlatformError, match="names no platform backend"):
        platform.choose("Linux", "linux")


def test_each_backend_is_a_platform() -> None:
    backends: list[platform.Platform] = [linux, portable]  # mypy checks each module's shape
    assert [b.NAME for b in backends] == list(platform.BACKENDS)
