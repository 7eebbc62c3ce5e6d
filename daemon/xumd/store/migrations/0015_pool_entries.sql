-- The warm pool (docs/ARCHITECTURE.md, "The warm pool"): checkouts made ahead of any create at
-- a project's base, each a record like a workspace. The row is committed before its
-- `git worktree add` (state `preparing`), so the start-up pass finds every entry that may exist
-- on disk; `ready` once made; `claiming` while a create takes it over (`claimed_by`, the
-- create's workspace id, and `claim_path`, where the checkout goes); `stale` once it may no
-- longer be claimed (the base moved, it was found dirty), until it is dropped. The claim's last
-- transaction deletes the row: the workspace row has taken the checkout over.
CREATE TABLE pool_entries (
    id           TEXT PRIMARY KEY,             -- pe_<16 hex>: also the checkout's directory name
    project_id   TEXT NOT NULL,
    path         TEXT NOT NULL,                -- <workspaces_dir>/.xum-pool/<id>
    incarnation  TEXT NOT NULL,                -- the lock reason's `xum-pool <id> <incarnation>`
    state        TEXT NOT NULL CHECK (state IN ('preparing', 'ready', 'claiming', 'stale')),
    base_commit  TEXT NOT NULL,                -- the detached HEAD the entry was made at
    sparse       TEXT,                         -- JSON cone patterns it was made with; NULL: full
    submodules   TEXT NOT NULL DEFAULT '[]',   -- JSON SubmoduleInfo list of its preparation
    claimed_by   TEXT,                         -- the workspace id of a `claiming` entry
    claim_path   TEXT,                         -- that workspace's path
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL
) STRICT;
CREATE INDEX pool_entries_project ON pool_entries(project_id, state);
