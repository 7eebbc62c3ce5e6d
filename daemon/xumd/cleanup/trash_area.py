"""Whether a trash entry that is not there is gone, or hidden.

A reclaim that finds its entry missing used to complete (a replay after the delete, or someone
deleted it). But a filesystem mounted over the trash area (over `ROOT/trash`, or over the
directory that holds a `.xum-trash`) after the move hides the entry: the space is still used,
and "completed" would be a false success that nothing revisits. The mount the area was on is
recorded when the entry is put there (its mount id; without mount ids, the portable backend, the
table's deepest mount point above it); a missing entry is hidden when that mount is still
mounted but the area's path now resolves to another mount. A mount id that no longer
exists (unmounted, or a reboot renumbered them) has nothing left to wait for: gone.
"""

from __future__ import annotations

import os
from pathlib import Path

from xumd.system import fsdelete, walk
from xumd.system.platform import current


def mount_of(path: Path) -> int | None:
    """The mount id `path` (a directory) resolves to now; None where unknown."""
    try:
        fd = os.open(path, current().O_LOOK | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return walk.mount_id(fd)
    finally:
        os.close(fd)


def _mount_table() -> dict[int, str]:
    """Mount id -> mount point, from the mount table (empty where there is none)."""
    try:
        data = fsdelete.MOUNTINFO.read_bytes()
    except FileNotFoundError:
        return {}
    table: dict[int, str] = {}
    for line in data.splitlines():
        fields = line.split(b" ")
        if len(fields) >= 5 and fields[0].isdigit():
            table[int(fields[0])] = fsdelete.decode_mount_field(fields[4])
    return table


def area_mount(area: Path) -> list[object] | None:
    """What to record when an entry is put in `area`: [mount id, mount point] of the mount the
    area is on (the point too: a reboot renumbers mounts, and an id may then name another)."""
    now = mount_of(area)
    if now is None:
        # No mount ids (the portable backend): the mount table's deepest point above it.
        try:
            return [None, fsdelete.mount_point_of(area)]
        except OSError:
            return None
    point = _mount_table().get(now)
    return None if point is None else [now, point]


def hiding_mount(entry: Path, recorded: object) -> str | None:
    """`entry` is not there. The mount point that now hides the area it was put in (on the
    mount `recorded` by `area_mount`), or None when nothing does: it is gone (or unknown, as
    before this was recorded)."""
    if not (isinstance(recorded, list) and len(recorded) == 2):
        return None
    recorded_id, recorded_point = recorded
    area = entry.parent
    while not os.path.lexists(area) and area != area.parent:
        area = area.parent  # a mount over an ancestor hides the area itself
    if recorded_id is None:
        # Recorded by mount point (no mount ids): hidden when the deepest mount point above
        # the area is now another one, the recorded one still mounted.
        over = fsdelete.mount_point_of(area)
        if over == recorded_point or recorded_point not in fsdelete.mount_points():
            return None
        return over
    now = mount_of(area)
    if now is None or now == recorded_id:
        return None
    table = _mount_table()
    if table.get(recorded_id) != recorded_point:
        return None  # that mount is gone (unmounted, or renumbered by a reboot)
    return table.get(now, str(area))
