-- Background gc runs (`gc.run {background: true}`): committed before the run starts, so a run a
-- crash or a stop cut short resumes at the next start (it plans afresh: each item is a lifecycle
-- operation the startup pass has settled by then).
CREATE TABLE gc_runs (
    id          TEXT PRIMARY KEY,                -- "gc_<hex>"
    keys        TEXT,                            -- JSON list, or NULL: every planned item
    state       TEXT NOT NULL,                   -- running|done
    result      TEXT NOT NULL DEFAULT '{}',      -- JSON GcRunResult once done
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
) STRICT;
CREATE INDEX gc_runs_state ON gc_runs(state, created_at);
