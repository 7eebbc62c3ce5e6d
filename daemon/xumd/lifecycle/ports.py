"""Ports of a workspace.

A workspace gets `count` ports from the root's range (`[ports]` in ROOT/config.toml). They are
allocated in the same transaction as the workspace's intent row, so a crash leaves either both
or neither; the table's primary key makes a port unique across the root, and its foreign key
(ON DELETE CASCADE) releases the ports with the row on every path that deletes it (removal, a
create's undo, the startup pass rolling a `creating` row back): no separate step can be
forgotten or half-done. A transaction never spans an `await`, so two creates never see the same
free port. Each candidate is checked free by binding it (127.0.0.1, and ::1 where the host has
IPv6) and on every interface (the wildcard addresses, which collide with a listener on any
one address): a port some other program listens on is skipped. Archived workspaces keep their
ports; unarchive re-checks them and replaces those that were taken meanwhile (reported).

Names: a project's `[ports] names` names the first ports of each new workspace, in order
(`XUM_PORT_<NAME>`); the name is a column of the port's row, so it stays with the position when
a taken port is replaced. A port of a live workspace that a process outside the workspace took
since it was allocated is told by `taken` (workspace.get reports it) and replaced on request
(`reallocate`): the workspace's own children (their environment names the workspace) listening on
its ports are what the ports are for.
"""

from __future__ import annotations

import errno
import re
import socket
import time
from collections.abc import Sequence

from xum_protocol.errors import ErrorKind
from xum_protocol.models.wsenv import PortChange, PortTaken

from xumd.base import logs
from xumd.base.config import PortsConfig
from xumd.base.errors import XumError
from xumd.store import Store
from xumd.system.platform import current

log = logs.get("xumd.lifecycle.ports")

# The loopback addresses, then every interface: a bind to the wildcard address fails while
# any one address holds the port (without SO_REUSEPORT), and a bind to one address fails while
# the wildcard holds it, so both together see a listener wherever it is bound.
_PROBES = (
    (socket.AF_INET, "127.0.0.1"),
    (socket.AF_INET6, "::1"),
    (socket.AF_INET, "0.0.0.0"),
    (socket.AF_INET6, "::"),
)

PORT_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
"""A port's name: it becomes `XUM_PORT_<NAME>` (upper-cased), so letters, digits and `_`."""


def names_problem(names: object) -> str | None:
    """Why `names` is not a valid `[ports] names` (None when it is)."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return "[ports] names must be a list of strings"
    bad = [n for n in names if not PORT_NAME_RE.fullmatch(n)]
    if bad:
        return (
            f"[ports] names: {bad[0]!r} is not a port name (a lower-case letter, then at most 31 "
            "lower-case letters, digits or '_')"
        )
    if len(set(names)) != len(names):
        return "[ports] names: a name is given twice"
    return None


def is_free(port: int) -> bool:
    """Whether `port` can be bound on the loopback addresses and on every interface now.
    SO_REUSEADDR as servers set it, so a port in TIME_WAIT counts as free while one a socket
    listens on does not. An address family the host lacks (no IPv6, no ::1) is not a reason to
    refuse."""
    for family, address in _PROBES:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # the family is not supported here
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((address, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                continue  # no such address on this host
            return False
        finally:
            sock.close()
    return True


def ports_of(store: Store, workspace_id: str) -> list[int]:
    rows = store.all(
        "SELECT port FROM workspace_ports WHERE workspace_id = ? ORDER BY position",
        (workspace_id,),
    )
    return [int(r["port"]) for r in rows]


def named_ports(store: Store, workspace_id: str) -> dict[str, int]:
    """The workspace's named ports, in position order: {name: port}."""
    rows = store.all(
        "SELECT name, port FROM workspace_ports WHERE workspace_id = ? AND name IS NOT NULL"
        " ORDER BY position",
        (workspace_id,),
    )
    return {str(r["name"]): int(r["port"]) for r in rows}


def _taken(store: Store) -> set[int]:
    return {int(r["port"]) for r in store.all("SELECT port FROM workspace_ports")}


def _pick(store: Store, cfg: PortsConfig, count: int) -> list[int]:
    """`count` ports of the range no workspace holds (archived ones too) and nothing listens on."""
    taken = _taken(store)
    found: list[int] = []
    for port in range(cfg.range_start, cfg.range_end + 1):
        if len(found) == count:
            break
        if port in taken or not is_free(port):
            continue
        found.append(port)
    if len(found) < count:
        size = cfg.range_end - cfg.range_start + 1
        raise XumError(
            ErrorKind.PORTS_EXHAUSTED,
            f"no {count} free port(s) left in {cfg.range_start}-{cfg.range_end} "
            f"({len(taken & set(range(cfg.range_start, cfg.range_end + 1)))} of {size} held by "
            "workspaces, others in use): remove workspaces, or widen [ports] range_start/"
            "range_end in ROOT/config.toml",
            needed=count,
            range=[cfg.range_start, cfg.range_end],
        )
    return found


def allocate(
    store: Store,
    workspace_id: str,
    count: int,
    cfg: PortsConfig,
    names: Sequence[str] = (),
) -> list[int]:
    """Give `workspace_id` `count` ports (at least one per name; the first ones carry the
    names). Call inside the transaction that inserts its row."""
    count = max(count, len(names))
    if count <= 0:
        return []
    found = _pick(store, cfg, count)
    now = time.time()
    for position, port in enumerate(found):
        store.execute(
            "INSERT INTO workspace_ports (port, workspace_id, position, allocated_at, name)"
            " VALUES (?, ?, ?, ?, ?)",
            (port, workspace_id, position, now, names[position] if position < len(names) else None),
        )
    log.info("ports.allocated", workspace=workspace_id, ports=found)
    return found


def recheck(store: Store, workspace_id: str, cfg: PortsConfig) -> list[PortChange]:
    """At unarchive: each port still free keeps its place; one taken meanwhile (something else
    listens on it: the workspace's processes are stopped while it is archived) is replaced by a
    new one at the same position. Inside a transaction."""
    busy = [p for p in ports_of(store, workspace_id) if not is_free(p)]
    return reallocate(store, workspace_id, cfg, busy)


def _belongs(pid: int | None, workspace_id: str) -> bool:
    """A listener is the workspace's own when its environment names the workspace: every child
    the daemon starts for it (and what they start) carries XUM_WORKSPACE_ID. One whose
    environment cannot be read (another user's, gone) is not proven the workspace's."""
    if pid is None:
        return False
    environ = current().environ(pid) or b""
    return f"XUM_WORKSPACE_ID={workspace_id}".encode() in environ.split(b"\0")


def held(store: Store, workspace_id: str) -> list[tuple[int, str | None]]:
    """The workspace's ports with their names, in position order."""
    rows = store.all(
        "SELECT port, name FROM workspace_ports WHERE workspace_id = ? ORDER BY position",
        (workspace_id,),
    )
    return [(int(r["port"]), None if r["name"] is None else str(r["name"])) for r in rows]


def taken(held: list[tuple[int, str | None]], workspace_id: str) -> list[PortTaken]:
    """Of `held` (`held(...)`), the ports a process outside the workspace listens on now. Blocking
    (a bind probe per port; who listens is read through the platform seam only when a port is
    not free, and on Linux stops once every listening socket is placed): run it off the event
    loop."""
    busy = {port: name for port, name in held if not is_free(port)}
    if not busy:
        return []
    listeners = current().listeners(set(busy))
    found: list[PortTaken] = []
    for port, name in busy.items():
        pids = listeners.get(port, {None})
        foreign = [pid for pid in pids if not _belongs(pid, workspace_id)]
        if foreign:
            pid = next((p for p in foreign if p is not None), None)
            found.append(PortTaken(port=port, name=name, pid=pid, command=_command(pid)))
    return found


def _command(pid: int | None) -> str | None:
    if pid is None:
        return None
    argv = current().cmdline(pid).rstrip(b"\0").replace(b"\0", b" ")
    return argv.decode(errors="replace")[:200] or None


def reallocate(
    store: Store, workspace_id: str, cfg: PortsConfig, which: Sequence[int]
) -> list[PortChange]:
    """Replace `which` (ports of this workspace) by free ones at the same positions, names
    kept. Inside a transaction. A port not the workspace's is refused by the caller."""
    if not which:
        return []
    fresh = _pick(store, cfg, len(which))  # held ports are rows: never picked again
    changes: list[PortChange] = []
    for old, new in zip(which, fresh, strict=True):
        store.execute(
            "UPDATE workspace_ports SET port = ?, allocated_at = ? WHERE port = ?"
            " AND workspace_id = ?",
            (new, time.time(), old, workspace_id),
        )
        changes.append(PortChange(old=old, new=new))
    log.info("ports.reallocated", workspace=workspace_id, count=len(changes))
    return changes
