"""`xum ws new` and `xum ws unarchive` under a disk budget, through a real daemon: the room gc
made for them (`evicted`) is shown, one line per item with its bytes."""

from __future__ import annotations

from pathlib import Path

from tests.cli.test_workspace import xum
from tests.gc.test_budget_create import MB, _config, _with_a, big, daemon_id
from tests.support.daemon import DaemonProcess
from tests.support.wait import until

__all__ = ["big"]  # the fixture, used by name


def test_ws_new_shows_what_gc_evicted_to_make_room(root: Path, big: Path) -> None:
    project, total = _with_a(root, big, package=True)
    _config(root, f"max_bytes = {total + MB}\n")
    daemon = DaemonProcess(root).start()
    try:
        out = xum(daemon, "ws", "new", project["id"], "b").stdout
        made = [line for line in out.splitlines() if line.startswith("made room: ")]
        assert len(made) == 1, out
        assert made[0].startswith("made room: evict_rebuildable a ("), out
        assert daemon_id(daemon, "b")
    finally:
        daemon.close()


def test_ws_unarchive_shows_what_gc_evicted_to_make_room(root: Path, big: Path) -> None:
    """`c` archived while `a` idles with PACKAGE bytes of node_modules: the unarchive's
    checkout fits only once gc evicted them, and `xum ws unarchive` says so."""
    project, _ = _with_a(root, big, package=True)
    _config(root, "")
    daemon = DaemonProcess(root).start()
    try:
        xum(daemon, "ws", "new", project["id"], "c")
        xum(daemon, "ws", "archive", f"{project['name']}/c")
        until(
            lambda: not (root / "workspaces" / "big" / "c").exists(),
            message="c's checkout reclaimed",
        )
        total = int(daemon.call("workspace.usage", {"refresh": True})["root"]["total_bytes"])
    finally:
        daemon.close()
    _config(root, f"max_bytes = {total + MB}\n")
    daemon = DaemonProcess(root).start()
    try:
        out = xum(daemon, "ws", "unarchive", f"{project['name']}/c").stdout
        made = [line for line in out.splitlines() if line.startswith("made room: ")]
        assert len(made) == 1, out
        assert made[0].startswith("made room: evict_rebuildable a ("), out
    finally:
        daemon.close()
