-- Projects, workspaces, rename journal, tombstones (lifecycle; see docs/ARCHITECTURE.md).
CREATE TABLE projects (
    id                  TEXT PRIMARY KEY,            -- "prj_<hex>"
    name                TEXT NOT NULL UNIQUE,
    path                TEXT NOT NULL UNIQUE,        -- realpath
    dev                 INTEGER NOT NULL,            -- st_dev of path
    ino                 INTEGER NOT NULL,            -- st_ino of path
    kind                TEXT NOT NULL,               -- 'git' | 'directory'
    workspaces_dir      TEXT,                        -- NULL: ROOT/workspaces/<project name>
    trusted_config_hash TEXT,                        -- sha256 of .xum/config.toml the user trusted
    created_at          REAL NOT NULL,
    updated_at          REAL NOT NULL
) STRICT;

CREATE TABLE workspaces (
    id                 TEXT PRIMARY KEY,             -- "ws_<hex>"
    project_id         TEXT NOT NULL REFERENCES projects(id),
    name               TEXT NOT NULL,
    runtime            TEXT NOT NULL,                -- 'worktree' | 'directory'
    path               TEXT NOT NULL,                -- planned/actual checkout path (absolute)
    branch             TEXT,
    base               TEXT,                         -- commit the branch was created from
    branch_created     INTEGER NOT NULL DEFAULT 0,   -- 1 if xum created the branch
    state              TEXT NOT NULL,                -- creating|active|archiving|archived|restoring|removing
    incarnation        TEXT NOT NULL,                -- fresh random nonce per materialisation
    dev                INTEGER,                      -- filesystem identity of the checkout
    ino                INTEGER,
    interrupted        INTEGER NOT NULL DEFAULT 0,
    interrupted_reason TEXT,
    setup_status       TEXT NOT NULL DEFAULT 'pending', -- pending|running|ok|failed|untrusted|none
    setup_output       TEXT,
    snapshot_ref       TEXT,
    snapshot_commit    TEXT,
    last_cleanup       TEXT,                         -- JSON: latest cleanup status
    auto_archive       TEXT,                         -- NULL | 'on_agent_exit'
    handle_id          TEXT,                         -- delegated turn that created it
    owner_workspace_id TEXT,                         -- owner of that turn
    version            INTEGER NOT NULL DEFAULT 1,   -- bumped on every update (CAS)
    created_at         REAL NOT NULL,
    updated_at         REAL NOT NULL,
    UNIQUE (project_id, name)
) STRICT;
CREATE INDEX workspaces_state ON workspaces(state);
CREATE INDEX workspaces_path ON workspaces(path);

-- One in-flight rename per workspace: {from, to, incarnation, phase} (docs/ARCHITECTURE.md, durable write order).
CREATE TABLE rename_journal (
    workspace_id TEXT PRIMARY KEY,
    from_name    TEXT NOT NULL,
    to_name      TEXT NOT NULL,
    from_path    TEXT NOT NULL,
    to_path      TEXT NOT NULL,
    from_branch  TEXT,
    to_branch    TEXT,
    incarnation  TEXT NOT NULL,
    phase        TEXT NOT NULL,                      -- intent|moved|branch_renamed
    created_at   REAL NOT NULL
) STRICT;

-- Removed workspaces, for audit (an id found here is still not_found to every method).
CREATE TABLE workspace_tombstones (
    id           TEXT PRIMARY KEY,
    project_id   TEXT NOT NULL,
    name         TEXT NOT NULL,
    branch       TEXT,
    snapshot_ref TEXT,
    removed_at   REAL NOT NULL
) STRICT;
