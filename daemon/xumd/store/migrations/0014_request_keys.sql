-- Request keys (docs/PROTOCOL.md, "Request keys"): a mutating call named by its client, so a
-- repeat is answered the first call's outcome instead of doing it again. Inserted before the
-- call runs; `target` is written in the operation's own intent transaction (a create's new
-- workspace id), so after a crash the row and the operation's durable state agree; `result` is
-- written with the answer. A row whose `result` is NULL and whose call no longer runs was cut by
-- a crash: a repeat settles it from the target's state. Rows older than the TTL are swept.
CREATE TABLE request_keys (
    request_key  TEXT PRIMARY KEY,
    method       TEXT NOT NULL,
    params_hash  TEXT NOT NULL,                -- sha256 of the params' canonical JSON, key left out
    target       TEXT,                         -- the operation's target id, once its intent committed
    result       TEXT,                         -- the answer's JSON result, once answered
    created_at   REAL NOT NULL
) STRICT;
CREATE INDEX request_keys_created ON request_keys(created_at);
