-- `workspace.list` orders and pages by the order the daemon recorded the workspaces, not by their
-- creation clock: with (created_at, id) as the keyset, a workspace created between two pages
-- with an earlier wall clock (the clock stepped back: NTP, a resumed VM) sorted before the cursor
-- and no page ever showed it. `listing_seq` only grows: it comes from a counter that a removal
-- never lowers (a max()+1 would hand a removed last row's number to the next workspace, behind
-- a cursor that came from it), and it is not the rowid, which VACUUM may renumber.
ALTER TABLE workspaces ADD COLUMN listing_seq INTEGER;

-- Existing rows keep the order they were listed in (creation time, then id), so a cursor of the
-- earlier form (lifecycle/listing.py) still finds its place.
CREATE TEMP TABLE listing_order (id TEXT PRIMARY KEY, n INTEGER NOT NULL);
INSERT INTO listing_order (id, n)
    SELECT id, row_number() OVER (ORDER BY created_at, id) FROM workspaces;
UPDATE workspaces SET listing_seq = (SELECT n FROM listing_order o WHERE o.id = workspaces.id);
DROP TABLE listing_order;

-- `last`: the number the latest workspace got. `numbered`: how many this migration numbered, the
-- only rows a cursor of the earlier form can have seen.
CREATE TABLE workspace_listing_counter (last INTEGER NOT NULL, numbered INTEGER NOT NULL) STRICT;
INSERT INTO workspace_listing_counter (last, numbered)
    SELECT count(*), count(*) FROM workspaces;

-- Every insert, whichever code path makes it, takes the next number in its own transaction.
CREATE TRIGGER workspaces_listing_seq AFTER INSERT ON workspaces
BEGIN
    UPDATE workspace_listing_counter SET last = last + 1;
    UPDATE workspaces SET listing_seq = (SELECT last FROM workspace_listing_counter)
        WHERE rowid = NEW.rowid;
END;

DROP INDEX workspaces_listing;
CREATE UNIQUE INDEX workspaces_listing_seq ON workspaces(listing_seq);
