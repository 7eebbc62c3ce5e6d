-- The cone-mode sparse-checkout patterns a workspace's own checkout had when it was archived
-- (JSON list of cone directories), so its unarchive re-applies that cone (lifecycle/sparse_cone.py).
-- Written in the archive's commit transaction (replaced at each archive, absent when the checkout
-- was not a cone-mode sparse checkout); released with its row (ON DELETE CASCADE).
CREATE TABLE workspace_sparse (
    workspace_id TEXT PRIMARY KEY REFERENCES workspaces(id) ON DELETE CASCADE,
    patterns     TEXT NOT NULL
) STRICT;
