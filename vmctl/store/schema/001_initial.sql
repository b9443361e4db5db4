-- vmctld schema version 1. Portable SQL: runs unchanged on SQLite and PostgreSQL.
-- Every record is a JSON document (TEXT) plus the columns that are looked up.
CREATE TABLE IF NOT EXISTS lease (
    id INTEGER PRIMARY KEY,
    holder TEXT,
    epoch BIGINT NOT NULL,
    expires DOUBLE PRECISION NOT NULL
);
INSERT INTO lease (id, holder, epoch, expires) VALUES (1, NULL, 0, 0) ON CONFLICT (id) DO NOTHING;
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    state TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS desired (
    node TEXT PRIMARY KEY,
    generation BIGINT NOT NULL,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS operations (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
    hash TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    expires DOUBLE PRECISION
);
