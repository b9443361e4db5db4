"""Node events of the ``Daemon``: agents registering, reporting and heart-beating, a lost or down node
coming back, drain and undrain, and the desired state an agent fetches.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from vmctl.daemon.actuator import Changes
from vmctl.daemon.base import DaemonBase
from vmctl.daemon.state import levels_offer, parse_vm_name
from vmctl.errors import Conflict
from vmctl.model import Discipline, JobState, NodeDesired, NodeObserved, PowerState
from vmctl.store.base import NodeRecord

log = logging.getLogger("vmctld")


class NodeEvents(DaemonBase):
    """Registration, reports, heartbeats, drain; the desired state of a node."""

    def _node_layout(self, name: str, rec: NodeRecord | None, levels: int | None,
                     discipline: Discipline | None) -> tuple[int, str]:
        """The level layout node ``name`` registers (None: what it had), checked against the cluster and
        the policy in force before anything changes."""
        lv = levels if levels is not None else rec.levels if rec is not None else 2
        dis = discipline if discipline is not None else Discipline(rec.discipline if rec is not None else "priority")
        problem = self.state.layout_problem(name, lv, dis)
        if problem is not None:
            raise Conflict(what=f"node {name}", problem=problem)
        if self.policy is not None and (len(self.state.nodes) - (rec is not None)) == 0:
            # the first node sets the cluster's layout (the others must match it): the policy must fit
            levels_offer(lv, dis).check(self.policy)
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
                busy = [j for j in self.state.jobs_on(name) if any(c >= cores for n, c in j.placement if n == name)]
                if busy:
                    raise Conflict(what=f"node {name}", problem=f"cannot shrink to {cores} cores: jobs run there")
                rec.cores = cores
                self.state.nodes_changed()
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

    def report(self, obs: NodeObserved) -> None:
        self._require_leader()
        rec = self.node(obs.node)
        now = self.clock.now()
        rec.last_seen = now
        ch = Changes()
        self._node_back(rec, ch)
        self._report_events(obs, now)
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

    def heartbeat(self, name: str) -> dict[str, Any]:
        """An agent's cheap sign of life (``POST /v1/agent/nodes/<n>/heartbeat``): keeps its node from
        being lost, and tells the agent the liveness settings and its node's current generation (an agent
        that fenced itself resumes its VMs only once it holds that generation). In memory only: a
        heartbeat writes the store only when it brings a lost or down node back."""
        self._require_leader()
        rec = self.node(name)
        rec.last_seen = self.clock.now()
        ch = Changes()
        self._node_back(rec, ch)
        if ch.any():
            self.commit(ch)
        cfg = self.config
        return {"node": name, "state": rec.state, "generation": self.state.generation.get(name, 0),
                "heartbeat_s": cfg.heartbeat_s, "node_timeout_s": cfg.node_timeout_s, "fence_s": cfg.fence_s,
                "node_down_s": cfg.node_down_s}

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
                           vms=self.state.desired.get(node, ()), slices=self.state.desired_slices.get(node))
