-- vmctld schema version 5: the event log (vmctl events, GET /v1/events). Portable SQL: runs unchanged on
-- SQLite and PostgreSQL. One row per event (job submitted, started, requeued, held, moved, ended; node
-- joined, lost, down, back, drained, removed; migrations; agent refusals; policy changes), numbered by
-- the leader in the order it happened and written in the transaction of the change it records. Rows older
-- than `retention.keep_s` are deleted by the daemon's housekeeping, like finished jobs.
CREATE TABLE IF NOT EXISTS events (
    seq BIGINT PRIMARY KEY,
    time DOUBLE PRECISION NOT NULL,
    kind TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_time ON events (time);
