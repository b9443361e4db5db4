-- vmctld schema version 3: what an agent registers about its host besides the cores. Portable SQL: runs
-- unchanged on SQLite and PostgreSQL. Core speed relative to a standard core, the node's group (cluster
-- or partition) and its memory in MiB (0 = not known), as columns of their own; a node stored by an
-- older vmctld gets the defaults (speed 1.0, group "default", memory not known) and keeps them until
-- its agent registers again.
ALTER TABLE nodes ADD COLUMN speed DOUBLE PRECISION NOT NULL DEFAULT 1.0;
ALTER TABLE nodes ADD COLUMN node_group TEXT NOT NULL DEFAULT 'default';
ALTER TABLE nodes ADD COLUMN memory_mib BIGINT NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS nodes_group ON nodes (node_group);
