"""Hosts: other machines whose daemon a client reaches through OpenSSH (docs/HOSTS.md).

A host is a name for an ssh destination, kept in the client's config
(`$XUM_HOSTS_FILE`, else `$XDG_CONFIG_HOME/xum/hosts.toml`, else `~/.config/xum/hosts.toml`):

    [hosts.devbox]
    dest = "me@devbox.example"       # anything `ssh` accepts, an ~/.ssh/config alias included
    remote_root = "/srv/xum"         # optional: the daemon root on that host
    [hosts.devbox.ssh_options]       # optional: `ssh -o K=V` each
    ConnectTimeout = "5"

A client reaches the host by running `ssh_command(entry)` and speaking the ordinary NDJSON
JSON-RPC over its stdin/stdout: on the host, `xum bridge` relays them to the daemon's socket.

Every piece that reaches the remote shell is quoted here: ssh joins its remote arguments with
spaces and hands the line to the user's login shell, so an unquoted root could run commands.
Names are checked as well, so a bad entry is refused when it is written, not when it is used.

Light on purpose (stdlib only): the CLI imports it on its start-up path when `--host` is given.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from xumd.system.atomicfile import write_atomic

from xum_client.errors import XumClientError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""A host's name: what `--host`, `XUM_HOST` and the config's table keys accept."""

OPTION_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9]{0,63}")
"""An ssh_config keyword (`ConnectTimeout`, `ProxyJump`, ...)."""

REMOTE_XUM_SCRIPT = (
    'x="${XDG_DATA_HOME:-$HOME/.local/share}/xum/venv/bin/xum"; '
    'if [ -x "$x" ]; then exec "$x" "$@"; fi; '
    'if command -v xum >/dev/null 2>&1; then exec xum "$@"; fi; '
    'if [ -x "$HOME/.local/bin/xum" ]; then exec "$HOME/.local/bin/xum" "$@"; fi; '
    'exec xum "$@"'
)
"""Run on the host by `sh -c`: the xum that `xum host install` put under the host's data
directory when it is there, else the one on PATH, else `~/.local/bin/xum` (where `pipx` and
`pip install --user` put it, often missing from a non-interactive shell's PATH); none: the
shell's own `not found`, status 127. A POSIX `sh` runs it whatever the user's login shell is
(fish, csh): the login shell only sees one single-quoted word."""

LOCK_TIMEOUT_S = 10.0
"""How long `xum host add|rm` waits for another one's read-modify-write of the hosts file."""

EXIT_SSH_FAILED = 255
"""ssh's own failure (cannot connect, key refused, host key mismatch): its stderr says which."""
EXIT_COMMAND_NOT_FOUND = 127
"""The remote shell's status for a command it cannot find: no xum on the host."""


class HostConfigError(XumClientError):
    """The hosts file cannot be read or written, or an entry is invalid (message names which)."""


@dataclass(frozen=True, slots=True)
class HostEntry:
    name: str
    dest: str
    remote_root: str | None = None
    ssh_options: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "dest": self.dest,
            "remote_root": self.remote_root,
            "ssh_options": dict(self.ssh_options),
        }


def hosts_file() -> Path:
    """`$XUM_HOSTS_FILE`, else `$XDG_CONFIG_HOME/xum/hosts.toml`, else `~/.config/...`."""
    explicit = os.environ.get("XUM_HOSTS_FILE")
    if explicit:
        return Path(explicit).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config).expanduser() / "xum" / "hosts.toml"


# -- validation ----------------------------------------------------------------------------------


def _control(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise HostConfigError(
            f"invalid host name {name!r}: use letters, digits, '.', '_' and '-' "
            "(at most 63, starting with a letter or digit)"
        )
    return name


def check_entry(entry: HostEntry) -> HostEntry:
    """`entry`, or HostConfigError naming what is wrong with it."""
    check_name(entry.name)
    dest = entry.dest
    # A destination starting with '-' would be an option to ssh had we not put `--` before it;
    # whitespace and control characters are never part of a host or an ssh_config alias.
    if not dest or dest.startswith("-") or _control(dest) or any(c.isspace() for c in dest):
        raise HostConfigError(
            f"host {entry.name!r}: invalid destination {dest!r} (an ssh destination: "
            "[user@]host, ssh://[user@]host[:port] or an ~/.ssh/config alias; no spaces, "
            "not starting with '-')"
        )
    if entry.remote_root is not None and (not entry.remote_root or _control(entry.remote_root)):
        raise HostConfigError(
            f"host {entry.name!r}: invalid remote root {entry.remote_root!r} "
            "(a path on the host, no control characters)"
        )
    for key, value in entry.ssh_options.items():
        if not OPTION_KEY_RE.fullmatch(key):
            raise HostConfigError(
                f"host {entry.name!r}: invalid ssh option name {key!r} (an ssh_config keyword)"
            )
        if not isinstance(value, str) or _control(value):
            raise HostConfigError(
                f"host {entry.name!r}: invalid value for ssh option {key}: {value!r}"
            )
    return entry


# -- the file ----------------------------------------------------------------------------------


def _line_of(text: str, name: str) -> int | None:
    """The line of the `[hosts.NAME]` table in `text` (for an error message), if found."""
    heads = {f"[hosts.{name}]", f'[hosts."{name}"]', f"[hosts.'{name}']"}
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().replace(" ", "") in heads:
            return number
    return None


def load_hosts(path: Path | None = None) -> dict[str, HostEntry]:
    """Every host in the hosts file (none when the file does not exist)."""
    path = path or hosts_file()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise HostConfigError(f"cannot read hosts file {path}: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line N, column M)".
        raise HostConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"hosts"})
    if unknown:
        raise HostConfigError(f"{path}: unknown top-level key {unknown[0]!r} (only [hosts.NAME])")
    tables = data.get("hosts", {})
    if not isinstance(tables, dict):
        raise HostConfigError(f"{path}: `hosts` must be a table of [hosts.NAME] tables")
    hosts: dict[str, HostEntry] = {}
    for name, table in tables.items():
        line = _line_of(text, name)
        where = f"{path}" + (f", line {line}" if line else "") + f" ([hosts.{name}])"
        if not isinstance(table, dict):
            raise HostConfigError(f"{where}: must be a table")
        extra = sorted(set(table) - {"dest", "remote_root", "ssh_options"})
        if extra:
            raise HostConfigError(f"{where}: unknown key {extra[0]!r}")
        dest = table.get("dest")
        root = table.get("remote_root")
        options = table.get("ssh_options", {})
        if not isinstance(dest, str):
            raise HostConfigError(f"{where}: `dest` (a string) is required")
        if root is not None and not isinstance(root, str):
            raise HostConfigError(f"{where}: `remote_root` must be a string")
        if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
            raise HostConfigError(f"{where}: `ssh_options` must be a table of strings")
        try:
            hosts[name] = check_entry(HostEntry(name, dest, root, dict(options)))
        except HostConfigError as exc:
            raise HostConfigError(f"{where}: {exc}") from None
    return hosts


def _toml_string(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's for every character check_entry admits)."""
    out = ['"']
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _toml_key(name: str) -> str:
    """A table key: bare when TOML allows (a '.' would nest tables), else quoted."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _toml_string(name)


def render_hosts(hosts: dict[str, HostEntry]) -> str:
    lines = ["# xum hosts (docs/HOSTS.md); `xum host add|rm` rewrite this file.", ""]
    for name in sorted(hosts):
        entry = hosts[name]
        lines.append(f"[hosts.{_toml_key(name)}]")
        lines.append(f"dest = {_toml_string(entry.dest)}")
        if entry.remote_root is not None:
            lines.append(f"remote_root = {_toml_string(entry.remote_root)}")
        if entry.ssh_options:
            lines.append(f"[hosts.{_toml_key(name)}.ssh_options]")
            for key in sorted(entry.ssh_options):
                lines.append(f"{key} = {_toml_string(entry.ssh_options[key])}")
        lines.append("")
    return "\n".join(lines)


def _write_atomic(path: Path, text: str) -> None:
    """Write `path` whole or not at all, durably: the user's hosts are not rebuilt from anywhere.

    A symlinked hosts file (a dotfiles manager's) is written through: its target is replaced,
    the link stays."""
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, text.encode("utf-8"), durable=True, mode=0o600)


@contextmanager
def _locked(path: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold the hosts file's lock (`.hosts.toml.lock` beside it) for a read-modify-write, so
    two `xum host add` at once both land (the rename alone keeps the file whole, not both
    changes). Waits at most `timeout`, then HostConfigError naming the lock."""
    timeout = LOCK_TIMEOUT_S if timeout is None else timeout
    lock_path = path.parent / f".{path.name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise HostConfigError(f"cannot lock hosts file {path}: {exc}") from None
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise HostConfigError(
                        f"hosts file {path} is locked by another xum for over {timeout:.0f}s "
                        f"({lock_path})"
                    ) from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)


def _update(path: Path, change: Callable[[dict[str, HostEntry]], HostEntry]) -> HostEntry:
    """Read the hosts file, apply `change` to its entries, write it back whole: all under its
    lock, so two writers at once both land."""
    with _locked(path):
        hosts = load_hosts(path)
        entry = change(hosts)
        try:
            _write_atomic(path, render_hosts(hosts))
        except OSError as exc:
            raise HostConfigError(f"cannot write hosts file {path}: {exc}") from None
    return entry


def add_host(entry: HostEntry, *, replace: bool = False, path: Path | None = None) -> HostEntry:
    """Add `entry` to the hosts file (an existing name: HostConfigError unless `replace`)."""
    path = path or hosts_file()
    check_entry(entry)

    def add(hosts: dict[str, HostEntry]) -> HostEntry:
        if entry.name in hosts and not replace:
            raise HostConfigError(
                f"host {entry.name!r} already exists in {path} (remove it first: "
                f"`xum host rm {entry.name}`)"
            )
        hosts[entry.name] = entry
        return entry

    return _update(path, add)


def remove_host(name: str, *, path: Path | None = None) -> HostEntry:
    """Remove host `name` from the hosts file; returns it (unknown: HostConfigError)."""
    path = path or hosts_file()

    def remove(hosts: dict[str, HostEntry]) -> HostEntry:
        if name not in hosts:
            raise HostConfigError(f"no host {name!r} in {path}")
        return hosts.pop(name)

    return _update(path, remove)


def get_host(name: str, *, path: Path | None = None) -> HostEntry:
    """Host `name`, or HostConfigError naming the file and the hosts it has."""
    check_name(name)
    path = path or hosts_file()
    hosts = load_hosts(path)
    if name not in hosts:
        known = ", ".join(sorted(hosts)) or "none"
        raise HostConfigError(
            f"no host {name!r} in {path} (known: {known}); add it with `xum host add {name} DEST`"
        )
    return hosts[name]


# -- the ssh command ---------------------------------------------------------------------------


def ssh_program() -> list[str]:
    """The ssh to run: `$XUM_SSH` split as a shell would (tests: `ssh -F <config>`), else ssh.
    The TypeScript client and the Neovim plugin split it by the same rules (POSIX `shlex`)."""
    text = os.environ.get("XUM_SSH") or "ssh"
    try:
        words = shlex.split(text)
    except ValueError as exc:
        # An unclosed quote or a trailing backslash: a clear error, not a traceback.
        raise HostConfigError(f"cannot split $XUM_SSH {text!r}: {exc}") from None
    return words or ["ssh"]


def ssh_base(entry: HostEntry) -> list[str]:
    """`ssh -T -o BatchMode=yes -o K=V ... -- DEST`: append one remote command (already quoted
    for a POSIX shell) to run something on the host."""
    check_entry(entry)
    options: list[str] = []
    for key, value in entry.ssh_options.items():
        options += ["-o", f"{key}={value}"]
    # -T: no terminal (the bytes are JSON, not keystrokes); BatchMode: never prompt for a
    # password or a passphrase, fail instead (a client has no one to ask).
    return [*ssh_program(), "-T", "-o", "BatchMode=yes", *options, "--", entry.dest]


def bridge_args(entry: HostEntry, root: str | None = None, socket: str | None = None) -> list[str]:
    """The remote xum's arguments for the bridge: `bridge [--root R] [--socket S]`."""
    args = ["bridge"]
    chosen_root = root if root is not None else entry.remote_root
    if chosen_root:
        args += ["--root", chosen_root]
    if socket:
        args += ["--socket", socket]
    return args


def remote_xum_command(*xum_args: str) -> str:
    """The remote shell line that runs the host's xum with `xum_args`, each word quoted."""
    for arg in xum_args:
        if "\x00" in arg:
            raise HostConfigError("an argument for the host contains a NUL byte")
    words = ["sh", "-c", REMOTE_XUM_SCRIPT, "xum", *xum_args]
    return " ".join(shlex.quote(w) for w in words)


def ssh_command(entry: HostEntry, *remote_args: str) -> list[str]:
    """The argv that runs `xum REMOTE_ARGS...` on the host (default: the bridge, with the
    entry's remote root)."""
    args = list(remote_args) if remote_args else bridge_args(entry)
    return [*ssh_base(entry), remote_xum_command(*args)]
