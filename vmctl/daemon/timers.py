"""The ``Daemon``'s timers (``housekeeping``, the first step of every decision-loop pass): node liveness
(lost, down), migrations past their timeout, jobs past their estimate, retention of finished jobs.
"""

from __future__ import annotations

import logging
import math

from vmctl.daemon import dispatcher
from vmctl.daemon.actuator import Changes
from vmctl.daemon.base import DaemonBase
from vmctl.daemon.retention import prune_finished
from vmctl.errors import LeaseLost, StoreError
from vmctl.model import JobState
from vmctl.store.base import NodeRecord

log = logging.getLogger("vmctld")


class Timers(DaemonBase):
    """The timers run at the start of each pass."""

    def housekeeping(self, now: float, ch: Changes) -> None:
        """The timers: nodes lost (no heartbeat for ``node_timeout_s``: unschedulable, jobs kept) and
        down (no heartbeat for ``node_down_s``: jobs requeued; their agent fenced them ``fence_s`` after
        its last contact, see docs/daemon.md), migrations past ``migration.timeout_s`` rolled back, fg jobs
        past estimate + grace killed (counting only the progress the agents observed:
        ``ClusterState.estimate_progress``). Timers that end work act only on what the agents reported to this
        daemon (``observed_at``), never on a state that may have changed while no daemon was listening."""
        st = self.state
        cfg = self.config
        prune_finished(self, now, ch)  # retention: finished jobs past retention.keep_s / keep_count
        self._prune_events(now)
        for n in st.nodes.values():
            age = now - n.last_seen
            if n.state in ("ready", "draining") and age > cfg.node_timeout_s * self.speed:
                self._node_silent(n, "lost", now, age, ch,
                                  f"its {len(st.jobs_on(n.name))} job(s) kept until loop.node_down_s")
                log.warning("node %s lost (no heartbeat for %.1f s): nothing new is placed there; its %d jobs "
                            "are kept until loop.node_down_s", n.name, age / self.speed, len(st.jobs_on(n.name)))
                st.nodes_changed()
            if n.state == "lost" and age > cfg.node_down_s * self.speed:
                self._node_silent(n, "down", now, age, ch, "its jobs are requeued")
                log.warning("node %s down (no heartbeat for %.1f s): its jobs are requeued (its agent paused "
                            "them after loop.fence_s)", n.name, age / self.speed)
                for job in st.jobs_on(n.name):
                    if job.migrating:
                        op = st.ops.get(job.migrating)
                        if op is not None:
                            srcs = {str(m["from"][0]) for m in op.detail.get("moves", [])}
                            if n.name not in srcs:  # the target died: go back to the source
                                self.actuator.rollback_migration(op, job, now, ch, f"node {n.name} down")
                                continue
                    if job.bag is not None:
                        # a task bag loses its workers there, not its results: the tasks they ran go
                        # back; with workers elsewhere it keeps running, else it is requeued with them
                        dispatcher.lose_node(job, n.name)
                        if job.placement:
                            self.actuator.touch(ch, job)
                            continue
                        self.actuator.stop_job(ch, job, now, JobState.QUEUED,
                                               f"requeued: node {n.name} down (finished tasks kept)", keep_results=True)
                        continue
                    self.actuator.stop_job(ch, job, now, JobState.QUEUED, f"requeued: node {n.name} down")
                st.nodes_changed()
            elif n.state == "draining" and not st.jobs_on(n.name):
                n.state = "drained"
                ch.nodes[n.name] = n
                self.events.add(now, "node.drained", f"node {n.name} drained (its last job left)", node=n.name)
        heard = self.observed_at
        for op in [o for o in st.ops.values() if o.state == "pending" and o.kind == "migrate"]:
            hosts = [str(h) for h in op.detail.get("hosts", [])]
            # not before every node of the migration reported to this daemon: it may have finished meanwhile
            if now - op.created > cfg.migration.timeout_s * self.speed and all(h in heard for h in hosts):
                mj = st.jobs.get(op.job_id)
                if mj is not None:
                    self.actuator.rollback_migration(op, mj, now, ch, "timed out")
        if cfg.kill_at_estimate:
            for job in st.active():
                # fg jobs, and gang jobs in any row (their modelled progress counts active slices only); a task
                # bag's length depends on the workers it is given: no run-time limit
                if job.state != JobState.RUNNING or not (job.gang or job.holds_fg) or job.migrating \
                        or job.bag is not None:
                    continue
                if not all(t.get("seen", True) for t in job.tasks):
                    continue  # not every process reported started yet: it cannot have overrun
                limit = st.run_limit(job) + cfg.estimate_grace_s
                # what the agents observed (fg time on its cores, bg stints by their CPU time), never the
                # modelled bg progress over a time no daemon watched (issue 23, estimate_progress)
                prog = st.estimate_progress(job, now)
                pace = st.pace(job)
                if prog <= limit or pace <= 0:
                    continue
                crossed = now - (prog - limit) / pace  # when its counted progress passed estimate + grace
                # killed only when every node it runs on reported it still running in a relist that arrived
                # after that moment (a process that exited meanwhile ends the job as done, not killed)
                if all(heard.get(node, -math.inf) > crossed for node, _c in job.placement):
                    self.actuator.stop_job(ch, job, now, JobState.KILLED, (
                        f"killed: ran past its estimate ({prog:.0f} s counted: fg time and bg CPU time; limit "
                        f"{st.run_limit(job):.0f} s + {cfg.estimate_grace_s:g} s grace)"))

    def _node_silent(self, n: NodeRecord, state: str, now: float, age: float, ch: Changes, then: str) -> None:
        """Node ``n`` has not been heard from for ``age`` (model seconds): it becomes ``state``."""
        n.state = state
        ch.nodes[n.name] = n
        ch.events.append(f"node {n.name} {state}")
        self.events.add(now, f"node.{state}", f"node {n.name} {state}: no heartbeat for {age / self.speed:.0f} s "
                        f"({then})", node=n.name)

    def _prune_events(self, now: float) -> None:
        """Retention of the event log: events older than ``retention.keep_s`` are deleted (when retention
        is on), like finished jobs. A store error is logged and tried again at the next pass."""
        cfg = self.config.retention
        if not cfg.enabled or not self.leader:
            return
        try:
            n = self.events.prune(self.store, self.epoch, now, cfg.keep_s)
        except LeaseLost:
            self.step_down()
            raise
        except StoreError as exc:
            log.warning("retention: could not prune the event log (tried again at the next pass): %s", exc)
            return
        if n:
            log.debug("retention: deleted %d events older than %.0f s", n, cfg.keep_s)
