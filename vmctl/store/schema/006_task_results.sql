-- vmctld schema version 6: a task bag's per-task results in their own table (issue 12). Portable SQL: runs
-- unchanged on SQLite and PostgreSQL. One row per (job, run, task) of a bag: the worker it was handed to,
-- when, when it ended, its exit status and error. A task end writes its row (and the bag's dispatcher state,
-- the `bag` column) instead of rewriting the job's document, which no longer holds them
-- (vmctl/store/tasks.py). A bag stored by an older vmctld has its results in its document: this migration
-- moves them out (a step in Python after these statements, `vmctl.store.tasks.move_out`), in `jobs` and
-- `job_archive`.
CREATE TABLE IF NOT EXISTS task_results (
    job_id TEXT NOT NULL,
    run INTEGER NOT NULL,
    task INTEGER NOT NULL,
    worker TEXT,
    started DOUBLE PRECISION,
    ended DOUBLE PRECISION,
    exit_status INTEGER,
    error TEXT,
    PRIMARY KEY (job_id, run, task)
);
ALTER TABLE jobs ADD COLUMN bag TEXT;
ALTER TABLE job_archive ADD COLUMN bag TEXT;
