-- When each workspace was last held (a lease, a supervised process's lease, a setup or teardown
-- run): stamped (wall time) as its last lease goes, whether released or reclaimed from a holder
-- that died. The disk budget's idleness reads it with the newest mtime in the checkout, so a
-- workspace held a moment before a restart is not idle after it (gc/evictplan.py). Released with
-- the workspace's row (ON DELETE CASCADE); a holder that outlives the row (a removed workspace's
-- teardown) stamps nothing.
CREATE TABLE workspace_activity (
    workspace_id TEXT PRIMARY KEY REFERENCES workspaces(id) ON DELETE CASCADE,
    held_at      REAL NOT NULL
) STRICT;
