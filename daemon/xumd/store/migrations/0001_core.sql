-- Core: daemon metadata (key/value), e.g. the last event sequence number.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
