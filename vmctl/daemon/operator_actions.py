"""Operator actions that change placements (``vmctl migrate``, ``vmctl vm priority set``): built as
actions, checked by the invariant checker like a policy's decision, and applied by the actuator.
"""

from __future__ import annotations

from typing import Any

from vmctl.daemon.actuator import ApplyResult, Changes
from vmctl.daemon.base import DaemonBase
from vmctl.daemon.state import ACTIVE
from vmctl.daemon.view import build_view
from vmctl.errors import Conflict, NotFound, ValidationError
from vmctl.model import Decision, Demote, JobState, Migrate, Promote, SetCap, Tier
from vmctl.policies.invariants import check_decision
from vmctl.store.base import OperationRecord


class OperatorActions(DaemonBase):
    """Migrations and VM priority changes an operator asks for."""

    # ------------------------------------------------------------------ operator actions through the checker
    def _operator_decision(self, actions: tuple[Any, ...]) -> tuple[ApplyResult, Changes]:
        self._require_leader()
        now = self.clock.now()
        view, lay = build_view(self.state, now)
        from vmctl.errors import InvariantViolation

        dec = Decision(actions=actions, reasons={}, default_reason="waiting")
        try:
            check_decision(view, dec, now)
        except InvariantViolation as exc:  # an operator's request the rules refuse: a conflict, not a bug
            raise Conflict(what=f"{actions[0].kind} of job {actions[0].job_id}",
                           problem=f"refused ({lay.name_cores(exc.message)})") from exc
        ch = Changes()
        saved = {j.id: j.reason for j in self.state.queue()}
        res = self.actuator.apply(dec, view, lay, now, ch)
        for rec in self.state.queue():  # an operator action does not change waiting reasons
            rec.reason = saved.get(rec.id, rec.reason)
            ch.jobs.pop(rec.id, None)
        self.state.forget_queue_reasons()
        if res.skipped:
            raise Conflict(what=f"{actions[0].kind} of job {actions[0].job_id}", problem=res.skipped[0][1])
        ch.events.append("operator action")
        self.commit(ch)
        return res, ch

    def migrate_job(self, job_id: str, to_node: str) -> OperationRecord:
        rec = self.job(job_id)
        node = self.node(to_node)
        if rec.state != JobState.RUNNING or rec.migrating:
            raise Conflict(what=f"job {job_id}", problem=f"is {rec.state}{' and migrating' if rec.migrating else ''}")
        if self.switch is not None:  # the nodes are being laid out anew: nothing moves meanwhile
            raise Conflict(what=f"job {job_id}", problem=f"cannot move while the policy switch to {self.switch.policy} "
                                                         "re-lays the cluster out (vmctl policy show)")
        if node.state != "ready":
            raise Conflict(what=f"node {to_node}", problem=f"is {node.state}")
        for src in sorted({n for n, _c in rec.placement}):
            why = self.state.migration_block(src, to_node)
            if why is not None:
                raise Conflict(what=f"migration of job {job_id} to {to_node}", problem=why)
        view, lay = build_view(self.state, self.clock.now())
        off = lay.offset[to_node]
        # a gang job (timeslice) moves within its row: the cores free in that row
        idle, slot = (view.idle_fg, "fg") if rec.level is None else (view.idle[rec.level], f"row {rec.level}")
        free = [off + c for c in range(node.cores) if (off + c) in idle]
        procs = len(rec.placement)
        if len(free) < procs:
            raise Conflict(what=f"node {to_node}", problem=f"has {len(free)} free {slot} cores, job needs {procs}")
        act = Migrate(job_id=job_id, cores=tuple(free[:procs]), tier=Tier.FG)
        saved = self.config.migration
        # an operator's migration is not subject to min_gain_s, but is to the concurrency limits
        self.actuator.limits = type(saved)(saved.max_per_host, saved.max_per_cluster, 0.0, False, saved.timeout_s)
        try:
            _res, ch = self._operator_decision((act,))
        finally:
            self.actuator.limits = saved
        ops = [o for o in ch.ops.values() if o.kind == "migrate"]
        if ops:
            ops[0].detail["origin"] = "operator"
            return ops[0]
        return OperationRecord(id=f"local-{job_id}", kind="migrate", job_id=job_id, state="done",
                               created=self.clock.now(), updated=self.clock.now(), detail={})

    def set_vm_priority(self, vm_name: str, tier: str | None, weight: int | None, cap: float | None,
                        cap_given: bool, pin: int | None) -> str:
        """Operator change of one job VM; returns the node. Tier changes apply to the whole job (all its
        processes share one tier) as Promote/Demote through the invariant checker."""
        from vmctl.daemon.state import parse_vm_name

        parsed = parse_vm_name(vm_name)
        rec = self.state.jobs.get(parsed[0]) if parsed else None
        if parsed is None or rec is None or rec.run != parsed[1] or rec.state not in ACTIVE \
                or parsed[2] >= len(rec.placement):
            raise NotFound(kind="vm", name=vm_name)
        idx = parsed[2]
        actions: list[Any] = []
        if tier is not None and tier != rec.tier:
            actions.append(Promote(job_id=rec.id) if tier == "fg" else Demote(job_id=rec.id))
        if cap_given:
            actions.append(SetCap(job_id=rec.id, cap=cap))
        if pin is not None:
            node, _c = rec.placement[idx]
            n = self.node(node)
            if not 0 <= pin < n.cores:
                raise ValidationError(field="pin", problem=f"core {pin} not in 0..{n.cores - 1} on {node}")
            lay = self.state.layout()
            cores = [lay.offset[p[0]] + p[1] for p in rec.placement]
            cores[idx] = lay.offset[node] + pin
            actions.append(Migrate(job_id=rec.id, cores=tuple(cores), tier=Tier(tier or rec.tier or "fg")))
        if actions:
            self._operator_decision(tuple(actions))
        if weight is not None:
            ch = Changes()
            rec.weight = weight
            self.actuator.touch(ch, rec)
            self.commit(ch)
        return rec.placement[idx][0]
