-- The state a workspace was in when its removal began (the `removing` intent), so that a removal
-- cut short (a crash, or a failure settled by the failure guard) puts the row back where it was
-- (recovery/reconcile.py): a flagged active or archived workspace is never turned into a
-- creation. Written in the intent's transaction (lifecycle/removing.py); released with its row
-- (ON DELETE CASCADE).
CREATE TABLE workspace_removing (
    workspace_id TEXT PRIMARY KEY REFERENCES workspaces(id) ON DELETE CASCADE,
    prior_state  TEXT NOT NULL
) STRICT;
