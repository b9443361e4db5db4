-- vmctld schema version 4: the VM level layout an agent registers for its host (issue 10, "Levels"):
-- the number of VM levels per core and their discipline (priority | timeslice | shared). Portable SQL:
-- runs unchanged on SQLite and PostgreSQL. A node stored by an older vmctld gets the layout every agent
-- had before (2 levels, priority: the MEASY fg/bg pair) and keeps it until its agent registers again.
ALTER TABLE nodes ADD COLUMN levels INTEGER NOT NULL DEFAULT 2;
ALTER TABLE nodes ADD COLUMN discipline TEXT NOT NULL DEFAULT 'priority';
