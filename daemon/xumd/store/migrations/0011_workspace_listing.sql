-- `workspace.list` reads workspaces in its listing order (creation time, then id) and pages by
-- keyset on that order: the index makes a page a range scan, not a sort of every row.
CREATE INDEX workspaces_listing ON workspaces(created_at, id);
