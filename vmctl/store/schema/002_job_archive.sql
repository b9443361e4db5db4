-- vmctld schema version 2: the job archive. Portable SQL: runs unchanged on SQLite and PostgreSQL.
-- Finished jobs pruned from the daemon's memory (config `retention:`, `archive: true`) move here in the
-- transaction that deletes them from `jobs`; `GET /v1/jobs/{id}` and `GET /v1/jobs?archived=true` read them.
CREATE TABLE IF NOT EXISTS job_archive (
    id TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    state TEXT NOT NULL,
    end_time DOUBLE PRECISION,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS job_archive_seq ON job_archive (seq);
CREATE INDEX IF NOT EXISTS job_archive_state_seq ON job_archive (state, seq);
