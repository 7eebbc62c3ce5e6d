"""The two lanes of cleanup work, so a large reclaim never delays another workspace's path.

`path`: what frees the checkout's path (teardown, trash); `reclaim`: deleting trash entries, which
may take minutes. Each lane runs its own background cycle and takes its own per-workspace lock.
"""

from __future__ import annotations

PATH_LANE = "path"
RECLAIM_LANE = "reclaim"
LANES: dict[str, tuple[str, ...]] = {
    PATH_LANE: ("teardown", "trash", "prune", "remove_dir"),
    RECLAIM_LANE: ("reclaim",),
}
