"""Install process containment (xumd.system.containment): markers for every child, the start-up
sweep of what a previous daemon instance of this root left running, the orphan reaper, and
`daemon.status` details['containment'].

Installed first, so its start-up step runs before adoption (`processes.adopt`) and the recovery
pass: nothing is reconciled or flagged while a crashed daemon's script is still writing into a
checkout. The sweep's answer to "adopt this leftover or stop it?" is given at construction: the
lease store's (`leased`, a full start builds the store first) or, on a lean start whose tables
hold nothing, `nothing_to_adopt`. The feature graph takes the containment at construction.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from xumd.app import App
from xumd.base import logs
from xumd.system import containment
from xumd.system.containment import Containment, Marker
from xumd.system.platform import current

if TYPE_CHECKING:  # the feature graph's: a lean start sweeps before loading them
    from xumd.processes.leases import LeaseStore

log = logs.get("xumd.system.containment")

REAP_INTERVAL_S = 1.0
SWEEP_GRACE_S = 2.0


Adoptable = Callable[[Marker], bool]
"""Which leftover the start-up sweep keeps: a live supervised process (and its tree) is
adopted, not stopped."""


def leased(leases: LeaseStore) -> Adoptable:
    """A leftover is adopted when a live lease names its process."""

    def adoptable(marker: Marker) -> bool:
        if not marker.record.startswith("proc_"):
            return False
        lease = leases.for_process(marker.record)
        return lease is not None and leases.is_live(lease)

    return adoptable


def nothing_to_adopt(marker: Marker) -> bool:
    """A lean start's answer: no table holds a row (`lazy_start.why_not_lean`), so no lease
    names a process, and the lease store is not even loaded before the sweep."""
    return False


def install(app: App, *, adoptable: Adoptable) -> Containment:
    setting = app.config.processes.cgroup
    cgroup, unusable = _cgroup(setting)
    cont = app.provide(
        Containment(
            tag=containment.root_tag(app.paths.root),
            subreaper=containment.is_subreaper(),
            cgroup=cgroup,
            cgroup_setting=setting,
            cgroup_unusable=unusable,
        )
    )

    async def sweep() -> None:
        left = await cont.sweep(adoptable, SWEEP_GRACE_S)
        if left:
            log.error("containment.sweep_survivors", pids=[m.pid for m in left])

    async def reap() -> None:
        # Orphans adopted by the subreaper become our zombies when they end.
        while True:
            containment.reap_orphans()
            await anyio.sleep(REAP_INTERVAL_S)

    log.info(
        "containment.mechanism",
        mechanism=cont.mechanism,
        instance=cont.instance,
        cgroup=str(cont.cgroup) if cont.cgroup else None,
    )
    app.on_startup("containment.sweep", sweep)
    if cont.subreaper:
        app.after_ready("containment.reaper", reap)
    app.status_providers["containment"] = cont.status
    return cont


def _cgroup(setting: str) -> tuple[Path | None, str | None]:
    """The cgroup runs get theirs under, and why a configured one cannot be used. `auto`
    without a delegated cgroup is not a failure (it means "where one is delegated")."""
    if setting == "off":
        return None, None
    if setting == "auto":
        return containment.cgroup_delegated(), None
    path = Path(setting)
    if path.is_absolute() and containment.cgroup_v2_dir(path):
        return path, None
    # Not usable: markers and the subreaper still hold; said in the log and in daemon.status.
    if not path.is_absolute():
        why = "not an absolute path"
    elif not current().CGROUPS:
        why = f"no cgroups on the {current().NAME} platform backend"
    elif not (path / "cgroup.procs").is_file():
        why = "not a cgroup v2 directory (no cgroup.procs)"
    else:
        why = "not writable by the daemon"
    log.warning("containment.cgroup_unusable", cgroup=setting, reason=why)
    return None, why
