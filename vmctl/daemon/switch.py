"""Switching the policy family in one command: drain, re-lay out the hosts, switch
(``vmctl policy set NAME --relayout``, ``PUT /v1/policy`` with ``relayout: true``).

A family of policies needs its own host layout (docs/policies.md, "Needs"): MEASY the fg/bg pair
(``priority``, 2 levels), gang scheduling one row per multiprogramming level (``timeslice``, ``mpl``
levels), vcsched capped shared VMs and task bags workers (``shared``). A switch to a policy whose layout
the cluster does not have goes in three phases, all derived from the state at every pass (nothing but
the ``SwitchRecord`` is stored, in kv ``policy.switch``):

1. *draining*: no policy decides (the old one is paused: it would place jobs of its family on hosts
   about to change, and the new one cannot manage the old family's jobs); the running jobs keep their
   placement and run to their end; queued and new jobs wait. Nothing is killed or requeued.
2. *re-laying out*: a node that no job holds gets the new layout in its desired state
   (``NodeDesired.layout``, ``ClusterState.wanted_layout``) at once, also while other nodes still drain;
   its agent re-lays the host out once it holds no job VM (docs/agent.md) and reports the layout it has
   (``NodeObserved.layout``), which vmctld records on the node.
3. *switched*: once no job runs and every node whose agent is alive (ready, draining, drained) reports
   the new layout, the new policy is put in force and the layout becomes the cluster's (kv
   ``cluster.layout``), in one transaction. Lost and down nodes are not waited for: they get the layout
   in their desired state and are not usable until their agent reports it.

``vmctl policy show`` (``switch_status``) says which phase, which jobs run on which nodes, and which
nodes have not reported the new layout (with their agents' errors, e.g. a layout the host's memory cannot
hold). ``vmctl policy cancel`` (``cancel_switch``) ends it: the old policy goes on, and nodes already re-laid
out are laid out back (they hold no job). A vmctld killed mid-switch loads the record and goes on.

Checked before anything changes (nothing half-applied): the policy and its parameters, that the layout
serves it, and that every node's memory holds the layout's L x C VMs (the memory each agent reports
per VM, else ``vm.memory_mib``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from vmctl.daemon.actuator import Changes
from vmctl.daemon.base import DaemonBase
from vmctl.daemon.gang import check_offer
from vmctl.daemon.state import levels_offer
from vmctl.daemon.switch_state import LAYOUT_KV, SWITCH_KV, SwitchRecord, layout_to_json, policy_layout
from vmctl.errors import Conflict, NotFound, PolicyNeedsUnmet, PolicyParameterError, VmctlError
from vmctl.model import Discipline, NodeLayout
from vmctl.policies.base import SchedulingPolicy

log = logging.getLogger("vmctld")

#: node states whose agent is alive: a switch waits for them to report the new layout
LIVE_STATES = ("ready", "draining", "drained")


class PolicySwitch(DaemonBase):
    """Start, follow, complete and cancel a policy switch that re-lays the cluster out."""

    def start_switch(self, name: str, params: dict[str, Any], layout: NodeLayout | None = None) -> SchedulingPolicy:
        """Begin switching to policy ``name`` with ``params`` on ``layout`` (None: the policy's own,
        ``Needs.layout``). When every node already has that layout, the policy is put in force at once."""
        self._require_leader()
        if self.switch is not None:
            raise Conflict(what="policy", problem=f"a switch to {self.switch.policy} ({self.switch.layout.text()}) is "
                                                  "in progress: wait for it (vmctl policy show) or cancel it "
                                                  "(vmctl policy cancel)")
        pol = self._make_policy(name, params)
        target = layout if layout is not None else policy_layout(pol)
        offer = replace(levels_offer(target.levels, target.discipline), where=f"vmctld on {target.text()}")
        try:
            check_offer(offer, pol)
        except PolicyParameterError as exc:  # (an mpl above the layout asked for, not above the registered one)
            raise PolicyParameterError(policy=pol.name, param=exc.fields["param"], problem=f"needs more levels than "
                                       f"the layout asked for ({target.text()})") from exc
        if target.discipline is Discipline.PRIORITY and target.levels != 2:
            raise PolicyNeedsUnmet(policy=pol.name, where=f"vmctld ({target.text()})",
                                   problem="vmctld's priority discipline has 2 levels (fg, bg)")
        self._check_memory(pol, target)
        st = self.state
        now = self.clock.now()
        old = self.policy.name if self.policy is not None else "none"
        if all(st.node_layout(n) == target for n in st.nodes):  # nothing to re-lay out: switch at once
            ch = Changes(kv={LAYOUT_KV: layout_to_json(target)}, desired_nodes=set(st.nodes))
            st.cluster_layout = target
            st.nodes_changed()
            self._policy_changed(pol, ch)
            return pol
        levels, discipline = st.cluster_levels()
        rec = SwitchRecord(policy=pol.name, params=dict(pol.params), layout=target,
                           from_policy=self.policy.name if self.policy is not None else None,
                           from_params=dict(self.policy.params) if self.policy is not None else {},
                           from_layout=NodeLayout(discipline, levels), started=now)
        self.switch = rec
        st.switch_layout = target
        st.nodes_changed()
        running = st.active()
        self.events.add(now, "policy.switch", f"policy switch {old} -> {pol.name} started: laying the cluster out "
                        f"in {target.text()}; {len(running)} running job(s) end first, queued jobs wait")
        log.warning("policy switch %s -> %s: laying the cluster out in %s (%d running jobs end first)",
                    old, pol.name, target.text(), len(running))
        ch = Changes(kv={SWITCH_KV: rec.to_json()}, desired_nodes=set(st.nodes))
        ch.events.append("policy switch")
        try:
            self.commit(ch)
        except Exception:
            self.switch, st.switch_layout = None, None
            raise
        self.dirty = True
        return pol

    def _check_memory(self, pol: SchedulingPolicy, target: NodeLayout) -> None:
        """Every node's memory must hold the layout's L x C VMs (refused naming the nodes, before anything
        changes); a node whose memory is not known (0) is not checked here (its agent refuses the layout)."""
        bad: list[str] = []
        for name in sorted(self.state.nodes):
            rec = self.state.nodes[name]
            obs = self.state.observed.get(name)
            per_vm = obs.layout_memory_mib if obs is not None and obs.layout_memory_mib > 0 else \
                self.config.vm_memory_mib
            need = target.levels * rec.cores * per_vm
            if rec.memory_mib > 0 and need > rec.memory_mib:
                bad.append(f"{name}: {target.levels} levels x {rec.cores} cores x {per_vm} MiB = {need} MiB > "
                           f"{rec.memory_mib} MiB")
        if bad:
            more = f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""
            raise PolicyNeedsUnmet(policy=pol.name, where=f"the registered nodes in {target.text()}",
                                   problem=f"the nodes' memory cannot hold the layout's VMs: "
                                           f"{'; '.join(bad[:5])}{more}")

    def cancel_switch(self) -> SwitchRecord:
        """End the switch in progress: the old policy goes on, the nodes are laid out as before."""
        self._require_leader()
        rec = self.switch
        if rec is None:
            raise NotFound(kind="policy switch", name="in progress")
        st = self.state
        now = self.clock.now()
        back = rec.from_layout
        self.switch, st.switch_layout = None, None
        if back is not None and any(st.node_layout(n) != back for n in st.nodes):
            st.cluster_layout = back  # the nodes re-laid out meanwhile go back (they hold no job)
        st.nodes_changed()
        ch = Changes(kv={SWITCH_KV: None, **({LAYOUT_KV: layout_to_json(st.cluster_layout)}
                                               if st.cluster_layout is not None else {})},
                     desired_nodes=set(st.nodes))
        ch.events.append("policy switch cancelled")
        self.events.add(now, "policy.switch", f"policy switch to {rec.policy} cancelled: policy {rec.from_policy} "
                        "goes on" + (f" on {back.text()}" if back is not None else ""))
        self.commit(ch)
        self.dirty = True
        return rec

    def advance_switch(self) -> bool:
        """Complete the switch in progress when it is done (no job runs, every live node reports the new
        layout); True when it completed."""
        rec = self.switch
        if rec is None or not self.leader:
            return False
        st = self.state
        if st.active() or self._not_relaid():
            return False
        try:
            pol = self._make_policy(rec.policy, rec.params)
        except VmctlError as exc:  # (a vmctld of another version loaded the switch): say so, keep waiting
            log.error("policy switch to %s cannot complete: %s (cancel it: vmctl policy cancel)", rec.policy, exc)
            return False
        now = self.clock.now()
        self.switch, st.switch_layout = None, None
        st.cluster_layout = rec.layout
        st.nodes_changed()
        ch = Changes(kv={SWITCH_KV: None, LAYOUT_KV: layout_to_json(rec.layout)}, desired_nodes=set(st.nodes))
        took = now - rec.started
        self.events.add(now, "policy.switch", f"policy switch to {rec.policy} done: the cluster is laid out in "
                        f"{rec.layout.text()} ({took:.0f} s)")
        log.warning("policy switch to %s done: %s (%.0f s)", rec.policy, rec.layout.text(), took)
        self._policy_changed(pol, ch)
        return True

    def _not_relaid(self) -> list[str]:
        """Live nodes that do not report the switch's layout yet."""
        rec, st = self.switch, self.state
        assert rec is not None
        return [n for n, r in sorted(st.nodes.items()) if r.state in LIVE_STATES and st.node_layout(n) != rec.layout]

    def switch_status(self) -> dict[str, Any] | None:
        """The switch in progress as ``GET /v1/policy`` answers it (``switch``), or None: its phase, the jobs
        it waits for (with their nodes), each node's layout and what it waits for there."""
        rec = self.switch
        if rec is None:
            return None
        st = self.state
        now = self.clock.now()
        jobs: list[dict[str, Any]] = [{"id": j.id, "name": j.name, "state": str(j.state),
                                       "nodes": sorted(st.nodes_of(j))} for j in st.active()]
        nodes: list[dict[str, Any]] = []
        for name, r in sorted(st.nodes.items()):
            has = st.node_layout(name)
            held = sorted(str(j["id"]) for j in jobs if name in j["nodes"])
            if has == rec.layout:
                waits = None
            elif held:
                waits = f"jobs {', '.join(held)} to end"
            elif r.state not in LIVE_STATES:
                waits = f"its agent (node {r.state}; re-laid out when it is back, not waited for)"
            else:
                errs = st.agent_errors.get(name)
                why = [e for e in errs[1] if "layout" in e] if errs is not None else []
                waits = "its agent to re-lay the host out" + (f" (it reports: {why[0]})" if why else "")
            nodes.append({"name": name, "state": r.state, "layout": layout_to_json(has), "relaid": has == rec.layout,
                          "jobs": held, "waiting_for": waits})
        pending = [n["name"] for n in nodes if not n["relaid"] and n["state"] in LIVE_STATES]
        phase = "draining" if jobs else "relayout" if pending else "switching"
        if jobs:
            where: dict[str, list[str]] = {}
            for j in jobs:
                for n in j["nodes"]:
                    where.setdefault(n, []).append(str(j["id"]))
            text = f"waiting for {len(jobs)} running job(s) to end: " + "; ".join(
                f"{n}: {', '.join(ids)}" for n, ids in sorted(where.items()))
            if pending:
                text += f"; not yet re-laid out: {', '.join(pending)}"
        elif pending:
            text = f"waiting for the agents of {', '.join(pending)} to re-lay out their hosts in {rec.layout.text()}"
        else:
            text = "every node is re-laid out: switching at the next pass"
        return {"policy": rec.policy, "params": dict(rec.params), "layout": layout_to_json(rec.layout),
                "from_policy": rec.from_policy, "from_params": dict(rec.from_params),
                "from_layout": None if rec.from_layout is None else layout_to_json(rec.from_layout),
                "started": rec.started, "elapsed_s": max(0.0, now - rec.started), "phase": phase,
                "waiting_for": text, "jobs": jobs, "nodes": nodes}

    def policy_waiting(self) -> str | None:
        """What the policy in force waits for, or None: a switch in progress, or no ready node in the
        cluster's layout (a configured gang policy before its nodes registered or re-laid out)."""
        if self.switch is not None:
            status = self.switch_status()
            assert status is not None
            return f"switching to policy {self.switch.policy} ({self.switch.layout.text()}): {status['waiting_for']}"
        pol, st = self.policy, self.state
        if pol is None:
            return None
        if st.cluster_layout is None:
            try:  # the agents' configs decide the layout (as before vmctld laid clusters out): waiting only
                check_offer(st.offer(), pol)  # for a policy their layout (or, with none, the default) cannot serve
                return None
            except VmctlError:
                pass
        levels, discipline = st.cluster_levels()
        lay = st.cluster_layout or (NodeLayout(discipline, levels) if st.nodes else policy_layout(pol))
        if any(r.state == "ready" and st.layout_ready(n) for n, r in st.nodes.items()):
            return None
        others = ", ".join(f"{n} ({st.node_layout(n).text()}, {r.state})" for n, r in sorted(st.nodes.items())[:5])
        return (f"policy {pol.name} waits for nodes: no ready node carries {lay.text()}"
                + (f" (registered: {others})" if others else " (no node registered yet)"))
