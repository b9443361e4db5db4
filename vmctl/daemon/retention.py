"""Retention of finished jobs (config ``retention:``; docs/daemon.md, "What vmctld promises").

A finished job (done, killed, failed, cancelled) stays in the daemon's memory for ``keep_s`` after it
ended, and at most the ``keep_count`` most recent finished jobs stay; older ones are pruned by the
housekeeping of each decision-loop pass, at most ``max_per_pass`` per pass (the choice is
``ClusterState.select_prunable``: a heap of finished jobs by end time, no scan of all jobs). With
``archive: true`` a pruned job moves to the store's ``job_archive`` table, where ``GET /v1/jobs/{id}``
and ``GET /v1/jobs?archived=true`` still find it; with ``archive: false`` it is deleted.

The store write is its own transaction, checked against the leader epoch like every write, and comes
first: the jobs leave memory only once the store no longer has them among the live jobs, so a crash
at any point leaves each job either live (loaded again at the next start) or archived/deleted.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from vmctl.errors import LeaseLost, StoreError

if TYPE_CHECKING:
    from vmctl.daemon.actuator import Changes
    from vmctl.daemon.base import DaemonBase

log = logging.getLogger("vmctld")


def prune_finished(d: DaemonBase, now: float, ch: Changes) -> int:
    """Prune the finished jobs that are due (never one that ``ch``, the event being handled, changed);
    returns how many. A store error leaves everything in memory (tried again at the next pass); a lost
    lease steps the daemon down and is raised, as a failed commit would."""
    cfg = d.config.retention
    if not cfg.enabled or not d.leader:
        return 0
    st = d.state
    recs = st.select_prunable(now, cfg.keep_s, cfg.keep_count, cfg.max_per_pass, skip=ch.jobs)
    if not recs:
        return 0
    try:
        d.store.prune_jobs(d.epoch, recs, cfg.archive)
    except LeaseLost:
        st.unselect(recs)
        d.step_down()
        raise
    except StoreError as exc:
        st.unselect(recs)
        log.warning("retention: could not prune %d finished jobs (tried again at the next pass): %s", len(recs), exc)
        return 0
    st.forget_jobs(recs)
    log.debug("retention: %s %d finished jobs (%d left in memory)", "archived" if cfg.archive else "deleted",
              len(recs), st.finished_count())
    return len(recs)
