"""Service definitions for running xumd under systemd (user units) or launchd.

One source for both the files in the repository (`systemd/`, rendered with placeholder paths,
checked by a test) and what `xum daemon install` writes for the current user (rendered with the
real path of `xumd`). Regenerate the repository copies with `python -m xum_client.units systemd`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from xml.sax.saxutils import escape

SERVICE_NAME = "xumd.service"
SOCKET_NAME = "xumd.socket"
LAUNCHD_LABEL = "dev.xum.xumd"
LAUNCHD_NAME = f"{LAUNCHD_LABEL}.plist"

REPO_XUMD = "%h/.local/bin/xumd"
"""ExecStart in the repository's unit: where `make install-user` links this checkout's xumd
(and where `pipx install` / `pip install --user` put it)."""
SYSTEMD_ROOT = "%S/xum"
"""The default root in systemd's words: %S is $XDG_STATE_HOME (~/.local/state) in a user unit."""
REPO_LAUNCHD_XUMD = "/usr/local/bin/xumd"
REPO_LAUNCHD_HOME = "/Users/USERNAME"

STOP_TIMEOUT_S = 90
"""Above the daemon's own bounded shutdown (grace + drains), so systemd never cuts it short."""
WATCHDOG_S = 30
LAUNCHD_SOCKET = "Listeners"
"""The key of the socket in the plist's `Sockets`: the name xumd passes to launch_activate_socket
(`xumd.rpc.server.LAUNCHD_SOCKET`, which a test holds equal)."""
SOCKET_MODE = 0o600


def literal(path: str) -> str:
    """A real path as systemd reads it: `%` starts a specifier, so it is doubled."""
    return path.replace("%", "%%")


def _quote(arg: str) -> str:
    # systemd's command-line quoting: double quotes, with backslash escapes.
    if arg and not any(c in arg for c in " \t\"'\\;$"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_service(xumd: str = REPO_XUMD, root: str = SYSTEMD_ROOT) -> str:
    exec_start = " ".join(_quote(a) for a in (xumd, "--root", root))
    return f"""\
# xumd as a systemd user service. Install for the current user with `xum daemon install`,
# or copy this file and xumd.socket to ~/.config/systemd/user/ (the repository's copy runs
# ~/.local/bin/xumd: `make install-user` links it there), then:
#   systemctl --user daemon-reload && systemctl --user enable --now xumd.socket
[Unit]
Description=xum workspace lifecycle daemon
# Socket activation: the socket unit owns ROOT/xumd.sock, so clients can connect at any time.
Requires={SOCKET_NAME}
After={SOCKET_NAME}

[Service]
# READY=1 once the socket serves (requests that read records wait for recovery);
# STOPPING=1 when a stop begins.
Type=notify
NotifyAccess=main
ExecStart={exec_start}
# Pings come from a task that checks real health (event loop, listener, state database).
WatchdogSec={WATCHDOG_S}
# SIGTERM to xumd alone, which stops its own children in order (bounded); whatever is left
# after TimeoutStopSec is SIGKILLed. With `--keep-processes` (agents that outlive a daemon
# restart), systemd would still SIGKILL them at a stop: use a drop-in with KillMode=process.
KillMode=mixed
# The unit's cgroup is xumd's to divide: each script and process gets its own cgroup in it, so
# a descendant that leaves its session and drops its environment is still contained
# ([processes] cgroup = "auto"; daemon.status says which mechanism holds).
Delegate=yes
KillSignal=SIGTERM
TimeoutStopSec={STOP_TIMEOUT_S}
Restart=on-failure
RestartSec=2
# 3: another xumd holds the root; 4: bad set-up (config, schema, socket path). A restart
# cannot fix either.
RestartPreventExitStatus=3 4
# Hardening that still lets xumd manage checkouts anywhere in the user's home: no privilege
# gain (setuid binaries, sudo included, do not elevate for xumd or the agents it starts),
# no realtime scheduling, no personality or foreign-ABI tricks. The usual umask: a checkout xum
# creates must have the same file modes as one the user creates (xum's own state is private
# through its 0700 root). Filesystem sandboxing (ProtectHome, ProtectSystem) is left out on
# purpose: checkouts and their tools live in the home directory and wherever the user's
# repositories are.
UMask=0022
NoNewPrivileges=yes
LockPersonality=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
SystemCallArchitectures=native
Environment=PYTHONUNBUFFERED=1

[Install]
WantedBy=default.target
Also={SOCKET_NAME}
"""


def render_socket(socket_path: str = f"{SYSTEMD_ROOT}/xumd.sock") -> str:
    return f"""\
# The socket of xumd.service (socket activation): the daemon starts on the first connection.
[Unit]
Description=xum workspace lifecycle daemon socket

[Socket]
ListenStream={socket_path}
SocketMode=0600
DirectoryMode=0700

[Install]
WantedBy=sockets.target
"""


def render_launchd(
    xumd: str = REPO_LAUNCHD_XUMD,
    root: str = f"{REPO_LAUNCHD_HOME}/.local/state/xum",
    log: str = f"{REPO_LAUNCHD_HOME}/Library/Logs/xumd.log",
) -> str:
    socket = f"{root}/xumd.sock"
    args = "".join(f"\n    <string>{escape(a)}</string>" for a in (xumd, "--root", root))
    return f"""\
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- xumd as a launchd agent. `xum daemon install` writes it with the real paths to
     ~/Library/LaunchAgents/{LAUNCHD_NAME}; then:
     launchctl bootstrap gui/$(id -u) ~/Library/LaunchAgents/{LAUNCHD_NAME} -->
<plist version="1.0">
<dict>
  <key>Label</key>
  <string>{LAUNCHD_LABEL}</string>
  <key>ProgramArguments</key>
  <array>{args}
  </array>
  <!-- Socket activation, as xumd.socket on Linux: launchd owns ROOT/xumd.sock (mode 0600,
       384 in decimal) and starts xumd at the first connection, which takes the socket with
       launch_activate_socket("{LAUNCHD_SOCKET}"). Neither RunAtLoad nor KeepAlive: demand alone
       starts it, after a crash as after `xum daemon stop` (KeepAlive's SuccessfulExit would
       imply RunAtLoad). -->
  <key>Sockets</key>
  <dict>
    <key>{LAUNCHD_SOCKET}</key>
    <dict>
      <key>SockFamily</key>
      <string>Unix</string>
      <key>SockType</key>
      <string>stream</string>
      <key>SockPathName</key>
      <string>{escape(socket)}</string>
      <key>SockPathMode</key>
      <integer>{SOCKET_MODE}</integer>
    </dict>
  </dict>
  <key>ThrottleInterval</key>
  <integer>2</integer>
  <!-- Above the daemon's own bounded shutdown. -->
  <key>ExitTimeOut</key>
  <integer>{STOP_TIMEOUT_S}</integer>
  <key>Umask</key>
  <integer>63</integer>
  <key>StandardErrorPath</key>
  <string>{escape(log)}</string>
  <key>StandardOutPath</key>
  <string>{escape(log)}</string>
</dict>
</plist>
"""


def repository_files() -> dict[str, str]:
    """The files under `systemd/` in the repository, by relative path."""
    return {
        SERVICE_NAME: render_service(),
        SOCKET_NAME: render_socket(),
        f"launchd/{LAUNCHD_NAME}": render_launchd(),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "systemd")
    for name, text in repository_files().items():
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
