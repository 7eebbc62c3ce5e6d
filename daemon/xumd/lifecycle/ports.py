"""Ports of a workspace.

A workspace gets `count` ports from the root's range (`[ports]` in ROOT/config.toml). They are
allocated in the same transaction as the workspace's intent row, so a crash leaves either both
or neither; the table's primary key makes a port unique across the root, and its foreign key
(ON DELETE CASCADE) releases the ports with the row on every path that deletes it (removal, a
create's undo, the startup pass rolling a `creating` row back): no separate step can be
forgotten or half-done. A transaction never spans an `await`, so two creates never see the same
free port. Each candidate is checked free by binding it (127.0.0.1, and ::1 where the host has
IPv6): a port some other program listens on is skipped. Archived workspaces keep their ports;
unarchive re-checks them and replaces those that were taken meanwhile (reported).
"""

from __future__ import annotations

import errno
import socket
import time

from xum_protocol.errors import ErrorKind
from xum_protocol.models.wsenv import PortChange

from xumd.base import logs
from xumd.base.config import PortsConfig
from xumd.base.errors import XumError
from xumd.store import Store

log = logs.get("xumd.lifecycle.ports")

_LOOPBACKS = ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"))


def is_free(port: int) -> bool:
    """Whether `port` can be bound on the loopback addresses now. SO_REUSEADDR as servers set
    it, so a port in TIME_WAIT counts as free while one a socket listens on does not. An
    address family the host lacks (no IPv6, no ::1) is not a reason to refuse."""
    for family, address in _LOOPBACKS:
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


def allocate(store: Store, workspace_id: str, count: int, cfg: PortsConfig) -> list[int]:
    """Give `workspace_id` `count` ports. Call inside the transaction that inserts its row."""
    if count <= 0:
        return []
    found = _pick(store, cfg, count)
    now = time.time()
    for position, port in enumerate(found):
        store.execute(
            "INSERT INTO workspace_ports (port, workspace_id, position, allocated_at)"
            " VALUES (?, ?, ?, ?)",
            (port, workspace_id, position, now),
        )
    log.info("ports.allocated", workspace=workspace_id, ports=found)
    return found


def recheck(store: Store, workspace_id: str, cfg: PortsConfig) -> list[PortChange]:
    """At unarchive: each port still free keeps its place; one taken meanwhile (something else
    listens on it) is replaced by a new one at the same position. Inside a transaction."""
    held = ports_of(store, workspace_id)
    busy = [p for p in held if not is_free(p)]
    if not busy:
        return []
    fresh = _pick(store, cfg, len(busy))  # the held ports are rows: never picked again
    changes: list[PortChange] = []
    for old, new in zip(busy, fresh, strict=True):
        store.execute(
            "UPDATE workspace_ports SET port = ?, allocated_at = ? WHERE port = ?",
            (new, time.time(), old),
        )
        changes.append(PortChange(old=old, new=new))
    log.info("ports.replaced", workspace=workspace_id, count=len(changes))
    return changes
