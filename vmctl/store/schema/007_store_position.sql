-- vmctld schema version 7: the store's position (vmctl.store.base.StorePosition). Portable SQL: runs
-- unchanged on SQLite and PostgreSQL. `commits` counts the leader's committed transactions and is raised
-- in each of them (the lease row is read and locked by every one anyway); `timeline` starts at 1 and is
-- raised by a deliberate rollback (`vmctld restore`, `vmctld accept-rollback`). The state directory
-- keeps the highest position it saw (STATE_DIR/store.highwater), so that a store older than that (a WAL
-- lost after a crash, an older copy put in place) is refused at start instead of served.
ALTER TABLE lease ADD COLUMN timeline BIGINT NOT NULL DEFAULT 1;
ALTER TABLE lease ADD COLUMN commits BIGINT NOT NULL DEFAULT 0;
