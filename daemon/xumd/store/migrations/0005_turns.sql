-- Delegated workspace turns. A turn row is written by the daemon only: for mode 'new' in
-- the same transaction as the target's `creating` intent row (which carries handle_id and
-- owner_workspace_id), so the binding can never be forged nor lost to a crash.
CREATE TABLE turns (
    id                  TEXT PRIMARY KEY,            -- "turn_<hex>" (the handle id)
    owner_workspace_id  TEXT NOT NULL,               -- no FK: audit outlives the owner row
    target_workspace_id TEXT,
    mode                TEXT NOT NULL,               -- new|existing
    state               TEXT NOT NULL,               -- creating|open|ended|failed
    reason              TEXT,                        -- why failed
    created_at          REAL NOT NULL,
    updated_at          REAL NOT NULL,
    ended_at            REAL
) STRICT;
CREATE INDEX turns_owner ON turns(owner_workspace_id, created_at);
CREATE INDEX turns_target ON turns(target_workspace_id);
CREATE INDEX workspaces_owner ON workspaces(owner_workspace_id);
