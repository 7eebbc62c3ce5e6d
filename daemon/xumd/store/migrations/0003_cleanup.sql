-- Durable cleanup obligations: one row per pending physical step.
-- A row is committed before its step is attempted; it is fenced by (incarnation, dev, ino) and the
-- on-disk marker when it runs, and it outlives the workspace row (removal writes a tombstone).
CREATE TABLE cleanup_obligations (
    id              TEXT PRIMARY KEY,                -- "ob_<hex>"
    workspace_id    TEXT NOT NULL,                   -- no FK: the workspace row may be gone
    project_id      TEXT NOT NULL,
    kind            TEXT NOT NULL,                   -- teardown|trash|prune|reclaim|remove_dir
    seq             INTEGER NOT NULL,                -- order of steps within one workspace
    path            TEXT NOT NULL,
    dev             INTEGER,
    ino             INTEGER,
    incarnation     TEXT NOT NULL,
    state           TEXT NOT NULL,                   -- pending|completed|abandoned|failed
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,                   -- wall time
    last_error      TEXT,                            -- bounded, keeps the diagnostic tail
    reason          TEXT,                            -- why abandoned/failed
    detail          TEXT NOT NULL DEFAULT '{}',      -- JSON (runtime, repo, admin_dir, trash_path, bytes)
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL
) STRICT;
CREATE INDEX cleanup_due ON cleanup_obligations(state, next_attempt_at);
CREATE INDEX cleanup_cursor ON cleanup_obligations(state, workspace_id, seq);
CREATE INDEX cleanup_workspace ON cleanup_obligations(workspace_id, seq);
CREATE INDEX cleanup_path ON cleanup_obligations(path, state);
