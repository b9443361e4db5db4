"""Node events of the ``Daemon``: agents registering, reporting and heart-beating, a lost or down node
coming back, drain and undrain, and the desired state an agent fetches.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from vmctl.daemon.actuator import Changes
from vmctl.daemon.base import DaemonBase
from vmctl.daemon.gang import check_offer
from vmctl.daemon.state import levels_offer, parse_vm_name
from vmctl.daemon.switch_state import policy_layout
from vmctl.errors import Conflict, VmctlError
from vmctl.model import Discipline, JobState, NodeLayout
from vmctl.nodedoc import NodeDesired, NodeObserved, PowerState
from vmctl.store.base import NodeRecord

log = logging.getLogger("vmctld")


class NodeEvents(DaemonBase):
    """Registration, reports, heartbeats, drain; the desired state of a node."""

    def _node_layout(self, name: str, rec: NodeRecord | None, levels: int | None,
                     discipline: Discipline | None) -> tuple[int, str]:
        """The level layout node ``name`` registers (None: what it had), checked against the cluster and
        the policy in force before anything changes."""
        st = self.state
        lv = levels if levels is not None else rec.levels if rec is not None else 2
        dis = discipline if discipline is not None else Discipline(rec.discipline if rec is not None else "priority")
        if st.cluster_layout is not None or st.switch_layout is not None:
            # vmctld lays the cluster out: the node's desired state tells its agent the layout to take (an
            # agent restarted with its config's layout takes it at once). While jobs hold the node, it keeps
            # the layout their VMs were placed in.
            if rec is not None and st.node_busy(name):
                return rec.levels, rec.discipline
            return lv, dis.value
        problem = st.layout_problem(name, lv, dis)
        if problem is not None:
            raise Conflict(what=f"node {name}", problem=problem)
        if self.policy is not None and (len(st.nodes) - (rec is not None)) == 0:
            # the first node sets the cluster's layout (the others must match it); a policy it cannot serve
            # (a configured gang policy on agents laid out for MEASY) lays the cluster out for the policy:
            # the node is told in its desired state and is usable once its agent reports it re-laid out
            try:
                check_offer(levels_offer(lv, dis), self.policy)
            except VmctlError:
                st.cluster_layout = policy_layout(self.policy)
                self._layout_unsaved = True
                log.warning("node %s registers %s, which policy %s cannot run on: the cluster is laid out in %s",
                            name, NodeLayout(dis, lv).text(), self.policy.name, st.cluster_layout.text())
        return lv, dis.value

    def register_node(self, name: str, cores: int, hostname: str, backend: str, peers: Iterable[str] | None = None,
                      checkpoint_peers: Iterable[str] | None = None, speed: float | None = None,
                      group: str | None = None, memory_mib: int | None = None, levels: int | None = None,
                      discipline: Discipline | None = None) -> NodeRecord:
        """A node agent (re)registers. ``peers``: the nodes its agent can live-migrate to (None: it did
        not say, not restricted); ``checkpoint_peers``: where it can send checkpoint files (None: shared
        storage, any node). Policies are offered only migrations these allow (``ClusterView.can_migrate``).
        ``speed``, ``group`` and ``memory_mib`` describe the host (None: the agent did not say; the node
        keeps what it had, at first the defaults) and reach the policy's view (``ClusterView.speed_of``).
        ``levels`` and ``discipline``: the agent's VM level layout (None: as before, at first 2 priority
        levels); refused (``Conflict``) when it differs from the other nodes' (``ClusterState.layout_problem``),
        and (``PolicyNeedsUnmet``) when the policy in force cannot run on the cluster it makes."""
        self._require_leader()
        now = self.clock.now()
        ch = Changes()
        rec = self.state.nodes.get(name)
        layout = self._node_layout(name, rec, levels, discipline)
        was = None if rec is None else rec.state
        if rec is None:
            rec = NodeRecord(name=name, cores=cores, state="ready", last_seen=now, hostname=hostname,
                             backend=backend, registered=now, generation=self.state.generation.get(name, 0))
            self.state.nodes[name] = rec
            self.state.nodes_changed()
        else:
            if rec.cores != cores:
                self._cores_change(rec, cores, now)
            elif rec.cores_pending is not None:  # the agent is back to the count it has: nothing to confirm
                rec.cores_pending = None
            rec.hostname, rec.backend, rec.last_seen = hostname, backend, now
            if rec.state == "lost":
                rec.state = "ready"
        reach = (None if peers is None else sorted(set(peers) - {name}),
                 None if checkpoint_peers is None else sorted(set(checkpoint_peers) - {name}))
        if (rec.peers, rec.checkpoint_peers) != reach:
            rec.peers, rec.checkpoint_peers = reach
            self.state.nodes_changed()  # a decision made on the old reachability is made again
        host = (rec.speed if speed is None else speed, rec.group if group is None else group,
                rec.memory_mib if memory_mib is None else memory_mib)
        if (rec.speed, rec.group, rec.memory_mib) != host:
            rec.speed, rec.group, rec.memory_mib = host
            self.state.nodes_changed()
        if (rec.levels, rec.discipline) != layout:
            rec.levels, rec.discipline = layout
            self.state.nodes_changed()
        ch.nodes[name] = rec
        ch.desired_nodes.add(name)
        ch.events.append(f"node {name} joined")
        what = "joined" if was is None else "back" if was == "lost" else "registered"
        self.events.add(now, f"node.{what}", f"node {name} {what} ({cores} cores"
                        + (f", was {was})" if was is not None else ")"), node=name)
        self.commit(ch)
        self.dirty = True
        return rec

    def _cores_change(self, rec: NodeRecord, cores: int, now: float) -> None:
        """A registered node's agent registers a different core count: it changes only when an operator
        confirmed that count (``confirm_cores``, ahead of the agent or after it asked). Otherwise the
        registration is refused (``Conflict``) and the count is kept as pending, with an event the first
        time, until an operator confirms it or the agent registers its old count again: a misconfigured
        or impersonated agent cannot make the policy place work on cores that do not exist."""
        name = rec.name
        if rec.cores_confirmed == cores:
            self._apply_cores(rec, cores, now, "its agent registered the count an operator confirmed")
            return
        if rec.cores_pending != cores:
            rec.cores_pending = cores
            ch = Changes()
            ch.nodes[name] = rec
            self.events.add(now, "node.cores_held", f"node {name} registers {cores} cores, but it has {rec.cores}: "
                            f"refused until an operator confirms (vmctl node cores {name} {cores})", node=name)
            self.commit(ch)
            log.warning("node %s registers %d cores (it has %d): refused until an operator confirms "
                        "(vmctl node cores %s %d)", name, cores, rec.cores, name, cores)
        raise Conflict(what=f"node {name}", problem=(
            f"registers {cores} cores, but vmctld has it with {rec.cores}: a node's core count changes only "
            f"when an operator confirms it (vmctl node cores {name} {cores}); until then this registration is "
            f"refused (or give the agent its {rec.cores} cores back)"))

    def _apply_cores(self, rec: NodeRecord, cores: int, now: float, why: str) -> None:
        """Node ``rec`` has ``cores`` cores from now on (confirmed); a node does not shrink under jobs."""
        name = rec.name
        busy = [j.id for j in self.state.jobs_on(name) if any(c >= cores for n, c in j.placement if n == name)]
        if busy:
            raise Conflict(what=f"node {name}", problem=(
                f"cannot shrink to {cores} cores: job(s) {', '.join(busy[:5])} run on its cores {cores} and up "
                f"(drain it first: vmctl node drain {name})"))
        was, rec.cores = rec.cores, cores
        rec.cores_pending = rec.cores_confirmed = None
        self.state.nodes_changed()
        ch = Changes()
        ch.nodes[name] = rec
        ch.desired_nodes.add(name)
        self.events.add(now, "node.cores_changed", f"node {name} has {cores} cores (was {was}): {why}", node=name)
        self.commit(ch)
        self.dirty = True

    def confirm_cores(self, name: str, cores: int) -> NodeRecord:
        """An operator confirms that node ``name`` has ``cores`` cores (``POST /v1/nodes/<n>/cores``): the
        count its agent asked for (pending) is applied now; another count is kept until the agent
        registers it; its current count clears what was pending (the change is declined). An event
        either way."""
        self._require_leader()
        rec = self.node(name)
        now = self.clock.now()
        if cores == rec.cores:
            declined = rec.cores_pending
            rec.cores_pending = rec.cores_confirmed = None
            ch = Changes()
            ch.nodes[name] = rec
            self.events.add(now, "node.cores_confirmed", f"node {name} keeps its {cores} cores (confirmed by an "
                            "operator" + (f"; the {declined} its agent registered stay refused)" if declined else ")"),
                            node=name)
            self.commit(ch)
            return rec
        if cores == rec.cores_pending:
            self._apply_cores(rec, cores, now, "confirmed by an operator (its agent registered that count)")
            return rec
        rec.cores_confirmed = cores
        ch = Changes()
        ch.nodes[name] = rec
        self.events.add(now, "node.cores_confirmed", f"node {name} may register {cores} cores (it has {rec.cores}): "
                        "confirmed by an operator, applied when its agent registers that count", node=name)
        self.commit(ch)
        return rec

    def report(self, obs: NodeObserved) -> None:
        self._require_leader()
        rec = self.node(obs.node)
        now = self.clock.now()
        rec.last_seen = now
        ch = Changes()
        self._node_back(rec, ch)
        if obs.generation_applied > self.state.generation.get(rec.name, 0):
            self._resync_generation(rec, obs.generation_applied, ch)
        self._report_events(obs, now)
        self._report_layout(rec, obs, now, ch)
        before = self.state._present.get(obs.node, frozenset())
        moving = set(self.state.in_flight)
        self.actuator.observe(obs, now, ch)
        for jid in (before - self.state._present.get(obs.node, frozenset())) | (moving - set(self.state.in_flight)):
            job = self.state.jobs.get(jid)
            if job is not None and job.state == JobState.QUEUED:  # it may start now (``ClusterState.lingering``)
                ch.events.append(f"the VMs of job {jid} on {obs.node} are gone")
        if not any(e.startswith("observe:") for e in obs.errors):
            # a fresh relist (a report whose relist failed repeats the agent's previous VM list)
            self.observed_at[rec.name] = now
        self.commit(ch)

    def _report_layout(self, rec: NodeRecord, obs: NodeObserved, now: float, ch: Changes) -> None:
        """The layout an agent reports is the node's (it re-lays its host out when its desired state asks
        for another one): recorded, so the node is usable again once it carries the cluster's layout. Only
        while vmctld lays the cluster out; otherwise the registration says it."""
        st = self.state
        if obs.layout is None or (st.cluster_layout is None and st.switch_layout is None):
            return
        old = st.node_layout(rec.name)
        if obs.layout == old:
            return
        rec.levels, rec.discipline = obs.layout.levels, obs.layout.discipline.value
        ch.nodes[rec.name] = rec
        ch.desired_nodes.add(rec.name)  # a timeslice node now gets the slice clock (and the other way round)
        ch.events.append(f"node {rec.name} re-laid out")
        st.nodes_changed()
        self.events.add(now, "node.relaid", f"node {rec.name} re-laid out: {old.text()} -> {obs.layout.text()}",
                        node=rec.name)
        log.info("node %s re-laid out: %s -> %s", rec.name, old.text(), obs.layout.text())

    def heartbeat(self, name: str, fenced_s: float | None = None) -> dict[str, Any]:
        """An agent's cheap sign of life (``POST /v1/agent/nodes/<n>/heartbeat``): keeps its node from
        being lost, and tells the agent the liveness settings and its node's current generation (an agent
        that fenced itself resumes its VMs only once it holds that generation). ``fenced_s``: how long
        (real seconds) the agent has held its job VMs paused by its fence, when it has (``_fence_pause``).
        In memory only: a heartbeat writes the store only when it brings a lost or down node back or
        ends a fence."""
        self._require_leader()
        rec = self.node(name)
        now = self.clock.now()
        rec.last_seen = now
        ch = Changes()
        self._node_back(rec, ch)
        if fenced_s:
            self._fence_pause(name, now, fenced_s, ch)
        if ch.any():
            self.commit(ch)
        cfg = self.config
        return {"node": name, "state": rec.state, "generation": self.state.generation.get(name, 0),
                "heartbeat_s": cfg.heartbeat_s, "node_timeout_s": cfg.node_timeout_s, "fence_s": cfg.fence_s,
                "node_down_s": cfg.node_down_s}

    def _fence_pause(self, name: str, now: float, fenced_s: float, ch: Changes) -> None:
        """Node ``name``'s agent held its job VMs paused for the last ``fenced_s`` real seconds (its fence:
        no contact with vmctld for ``fence_s``, e.g. while no vmctld ran). Its fg jobs got no time on
        their cores meanwhile: that time leaves their estimate's account (``estimate_progress``), so
        an outage does not bring their kill forward. Each stretch is taken off once (``_fence_credited``,
        memory only; a daemon that restarts within one fence may take it off again: a later kill, never
        an earlier one)."""
        start = now - fenced_s * self.speed
        since = max(start, self._fence_credited.get(name, -math.inf))
        self._fence_credited[name] = now
        if since >= now:
            return
        for job in self.state.jobs_on(name):
            if not job.holds_fg or job.gang or job.tier_since is None:
                continue
            paused = now - max(since, job.tier_since)
            if paused <= 0:
                continue
            if job.est_base is None:  # stored before the account was kept: start it from the model
                job.est_base = job.progress_base
            job.est_base -= paused  # an offset: the stint's time (now - tier_since) is at least `paused`
            ch.jobs[job.id] = job
            log.info("job %s: %.1f s paused by node %s's fence do not count against its estimate", job.id,
                     paused / self.speed, name)
    def _resync_generation(self, rec: NodeRecord, applied: int, ch: Changes) -> None:
        """The agent applied a desired generation the store never had: the store was rolled back (``vmctld
        restore``, ``vmctld accept-rollback``) after that generation was committed. The agent would ignore
        every generation up to it (it long-polls for newer ones) and go on running the VMs of changes the
        store lost, so the node's desired state, as the store derives it, is written again above it."""
        had = self.state.generation.get(rec.name, 0)
        log.warning("node %s applied desired generation %d but the store's is %d (the store was rolled back): "
                    "its desired state is written again as generation %d", rec.name, applied, had, applied + 1)
        self.state.generation[rec.name] = applied
        self.force_desired.add(rec.name)
        ch.desired_nodes.add(rec.name)
        ch.events.append(f"node {rec.name} resynced")
        self.events.add(self.clock.now(), "node.resynced",
                        f"node {rec.name} had applied desired generation {applied}, the store only {had} (a rollback "
                        f"of the store): its desired state is now generation {applied + 1}", node=rec.name)

    def _node_back(self, rec: NodeRecord, ch: Changes) -> None:
        """The agent of a lost or down node was heard from: the node is schedulable again (a lost node
        kept its jobs; a down node's were requeued)."""
        if rec.state in ("lost", "down"):
            log.warning("node %s back (was %s)", rec.name, rec.state)
            rec_was, rec.state = rec.state, "ready"
            ch.nodes[rec.name] = rec
            ch.events.append(f"node {rec.name} back")
            self.events.add(self.clock.now(), "node.back", f"node {rec.name} back (was {rec_was})", node=rec.name)
            self.state.nodes_changed()

    def set_node_state(self, name: str, drain: bool, reason: str | None = None) -> NodeRecord:
        self._require_leader()
        rec = self.node(name)
        ch = Changes()
        if drain and rec.state == "ready":
            rec.state = "draining" if self.state.jobs_on(name) else "drained"
        elif not drain and rec.state in ("draining", "drained"):
            rec.state = "ready"
        rec.drain_reason = reason if drain else None
        ch.nodes[name] = rec
        ch.events.append(f"node {name} {rec.state}")
        what = rec.state if drain else "undrained"
        self.events.add(self.clock.now(), f"node.{what}", f"node {name} {what}" + (f": {reason}" if reason else ""),
                        node=name)
        self.commit(ch)
        return rec

    def _report_events(self, obs: NodeObserved, now: float) -> None:
        """Events for what an agent's report says anew: refusals (of a migration or a VM of its desired
        state) and errors that its previous report did not have."""
        prev = self.state.observed.get(obs.node)
        old_refusals = set(prev.refusals) if prev is not None else set()
        for r in obs.refusals:
            if r not in old_refusals:
                mig = f" (migration {r.migration_id} to {r.target_node})" if r.migration_id else ""
                self.events.add(now, "node.refused", f"agent of {obs.node} refused {r.vm}{mig}: {r.reason}",
                                node=obs.node)
        self._orphan_events(obs, prev, now)
        old_errors = set(prev.errors) if prev is not None else set()
        new_errors = [e for e in obs.errors if e not in old_errors]
        if new_errors:
            more = f" (+{len(new_errors) - 3} more)" if len(new_errors) > 3 else ""
            self.events.add(now, "node.error", f"agent of {obs.node} reports: {'; '.join(new_errors[:3])}{more}",
                            node=obs.node)

    def _orphan_events(self, obs: NodeObserved, prev: NodeObserved | None, now: float) -> None:
        """Events for the VMs an agent reports as orphans (``VmObserved.orphan``: no desired state wants
        them; its reconcile stops and removes them): one when one is first seen, one when it is gone,
        each naming the job and the run (from vmctld's VM name)."""
        before = {v.name: v for v in prev.vms if v.orphan} if prev is not None else {}
        for v in obs.vms:
            if not v.orphan:
                continue
            gone = v.power is PowerState.ABSENT
            was = before.get(v.name)
            if was is not None and (was.power is PowerState.ABSENT or not gone):
                continue  # already told
            parsed = parse_vm_name(v.name)
            job_id = parsed[0] if parsed is not None else None
            whose = f" of job {parsed[0]} run {parsed[1]}" if parsed is not None else ""
            if parsed is not None:
                rec = self.state.jobs.get(parsed[0])
                if rec is not None:
                    whose += f" (the job is {rec.state}" + (f", now in run {rec.run})" if rec.run != parsed[1] else ")")
            what = "removed" if gone else f"found {v.power.value}, being removed"
            if gone and was is None:
                what = "removed (no desired state wanted it)"
            elif not gone:
                what += " (no desired state wants it)"
            self.events.add(now, "vm.orphan-removed" if gone else "vm.orphan",
                            f"VM {v.name}{whose} on node {obs.node} {what}", job_id=job_id, node=obs.node)

    def desired(self, node: str) -> NodeDesired:
        self.node(node)
        return NodeDesired(node=node, generation=self.state.generation.get(node, 0),
                           vms=self.state.desired.get(node, ()), slices=self.state.desired_slices.get(node),
                           layout=self.state.desired_layout.get(node))
