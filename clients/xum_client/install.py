"""`xum daemon install`: put xumd's service definition in place for the current user.

It writes files only, and prints the commands that enable and start the service: a user should
see (and may veto) what changes in their session manager.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from xum_client import units
from xum_client.sync import default_root


def xumd_executable() -> str:
    """The `xumd` that belongs to this client's installation (its venv), else the one on PATH."""
    sibling = Path(sys.executable).parent / "xumd"
    if sibling.exists():
        return str(sibling.absolute())
    import shutil

    found = shutil.which("xumd")
    if found is None:
        raise FileNotFoundError("cannot find the xumd executable next to this Python or on PATH")
    return str(Path(found).absolute())


def install(
    *, root: str | None = None, dry_run: bool = False, platform: str = sys.platform
) -> dict[str, Any]:
    """Write the service files; returns {"files": {path: text}, "commands": [...]}."""
    xumd = xumd_executable()
    home = Path.home()
    if platform == "darwin":
        real_root = str(Path(root).absolute()) if root else str(default_root().absolute())
        target = home / "Library" / "LaunchAgents" / units.LAUNCHD_NAME
        log = str(home / "Library" / "Logs" / "xumd.log")
        files = {str(target): units.render_launchd(xumd, real_root, log)}
        commands = [
            f"launchctl bootstrap gui/{os.getuid()} {shlex.quote(str(target))}",
            f"xum{' --root ' + shlex.quote(real_root) if root else ''} status",
        ]
    else:
        config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
        unit_dir = config / "systemd" / "user"
        # Without --root, the units use systemd's own %S (the state dir), like xumd's default.
        unit_root = units.literal(str(Path(root).absolute())) if root else units.SYSTEMD_ROOT
        files = {
            str(unit_dir / units.SERVICE_NAME): units.render_service(
                units.literal(xumd), unit_root
            ),
            str(unit_dir / units.SOCKET_NAME): units.render_socket(f"{unit_root}/xumd.sock"),
        }
        commands = [
            "systemctl --user daemon-reload",
            # The socket starts the daemon on first use; `enable --now xumd.service` would
            # start it at login instead.
            "systemctl --user enable --now xumd.socket",
            "systemctl --user status xumd.socket xumd.service",
            "journalctl --user -u xumd.service -f    # the daemon's log",
        ]
    if not dry_run:
        if platform == "darwin":
            # launchd binds ROOT/xumd.sock before xumd first runs: the root must exist, private.
            Path(real_root).mkdir(mode=0o700, parents=True, exist_ok=True)
        for path, text in files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
    return {"files": files, "commands": commands, "xumd": xumd, "dry_run": dry_run}
