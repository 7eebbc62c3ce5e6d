"""The state a removal began from (table `workspace_removing`).

A `removing` row means the removal's intent committed and nothing was deleted yet: a crash or a
failure there rolls it back to the very state it was removed from (recovery/reconcile.py). A
flagged one (interrupted: a creation never kept, or an active or archived workspace flagged by
an earlier recovery) keeps its flag and reason, so the user resolves it as before; one that was
not flagged is flagged by a crash (the removal was interrupted). That state is recorded here in
the intent's transaction: the row itself only says `removing`. Without a record (a removal
begun by an older daemon) the checkout decides.
"""

from __future__ import annotations

from xumd.store import Store


def record_prior(store: Store, workspace_id: str, state: str) -> None:
    """Inside the transaction that commits `removing` (replaces an earlier removal's record)."""
    store.execute(
        "INSERT OR REPLACE INTO workspace_removing (workspace_id, prior_state) VALUES (?, ?)",
        (workspace_id, state),
    )


def prior_state(store: Store, workspace_id: str) -> str | None:
    """The state the workspace's last removal began from; None when none was recorded (a
    removal begun by a daemon older than this record)."""
    found = store.one(
        "SELECT prior_state FROM workspace_removing WHERE workspace_id = ?", (workspace_id,)
    )
    return str(found["prior_state"]) if found is not None else None
