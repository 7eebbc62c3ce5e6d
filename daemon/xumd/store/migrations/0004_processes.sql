-- Durable use leases: one row per (holder, workspace, kind), written before the effect it
-- covers and removed when it ends. A lease of a daemon-spawned process is also that process's
-- durable record, so that a process still running after a daemon crash is found and adopted.
CREATE TABLE leases (
    id           TEXT PRIMARY KEY,                   -- "lease_<hex>"
    workspace_id TEXT NOT NULL,                      -- no FK: a holder may outlive the row
    kind         TEXT NOT NULL,                      -- agent|terminal|mcp|exec|setup|teardown|editor|...
    holder       TEXT NOT NULL,                      -- proc_<hex> | pid:<pid>:<start> | run:<hex>
    pid          INTEGER,                            -- NULL until the child exists
    pgid         INTEGER,                            -- the holder's group (only if it leads it)
    start_time   REAL,                               -- psutil create_time of pid
    owner_pid    INTEGER NOT NULL,                   -- the daemon that wrote it
    owner_start  REAL,                               -- ... and its start time
    label        TEXT NOT NULL DEFAULT '',
    process_id   TEXT,                               -- daemon-spawned: the supervisor's id
    detail       TEXT NOT NULL DEFAULT '{}',         -- JSON: argv, pty, foreground (no env)
    created_at   REAL NOT NULL,
    UNIQUE (holder, workspace_id, kind)
) STRICT;
CREATE INDEX leases_workspace ON leases(workspace_id);
CREATE INDEX leases_process ON leases(process_id);

-- Outcome of the latest auto-archive attempt (JSON), shown on the workspace.
ALTER TABLE workspaces ADD COLUMN auto_archive_outcome TEXT;
