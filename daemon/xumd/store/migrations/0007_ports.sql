-- Ports and environment of a workspace.
-- Ports: allocated in the intent transaction of `workspace.create` (before any checkout exists),
-- kept while the workspace is archived, and released with its row (ON DELETE CASCADE: a create's
-- undo, the startup pass rolling a `creating` row back, and a removal all delete the row, and the
-- ports go in the same transaction). The primary key makes a port unique across the root.
CREATE TABLE workspace_ports (
    port         INTEGER PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    position     INTEGER NOT NULL,                   -- 0 is XUM_PORT
    allocated_at REAL NOT NULL,
    UNIQUE (workspace_id, position)
) STRICT;

-- The environment a workspace's setup, teardown and processes get: the project's [env] merged
-- with `workspace.create {env}` (JSON object of strings), fixed at create.
CREATE TABLE workspace_env (
    workspace_id TEXT PRIMARY KEY REFERENCES workspaces(id) ON DELETE CASCADE,
    env          TEXT NOT NULL
) STRICT;
