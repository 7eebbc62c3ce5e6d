-- A workspace's named ports: `[ports] names` in the project's config names the first ports of a
-- workspace (XUM_PORT_<NAME>), in order; the rest stay anonymous (NULL). A name is unique within
-- its workspace.
ALTER TABLE workspace_ports ADD COLUMN name TEXT;
CREATE UNIQUE INDEX workspace_ports_name ON workspace_ports (workspace_id, name)
    WHERE name IS NOT NULL;
