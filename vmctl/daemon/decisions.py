"""The ``Daemon``'s decision pass: housekeeping, the view, the policy and its checked decision,
actuation and commit (``run_once``, or ``begin_pass`` / ``choose`` / ``finish_decision`` when the
API server runs the policy in a worker thread; see ``vmctl.daemon.core``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from vmctl.daemon.actuator import ApplyResult, Changes
from vmctl.daemon.gang import matrix_doc
from vmctl.daemon.state import Layout
from vmctl.daemon.switch import PolicySwitch
from vmctl.daemon.timers import Timers
from vmctl.daemon.view import PreparedView, build_view, prepare_view
from vmctl.errors import PolicyNeedsUnmet
from vmctl.model import ClusterView, Decision, Discipline
from vmctl.policies.base import SchedulingPolicy
from vmctl.policies.invariants import check_decision

log = logging.getLogger("vmctld")

_gc_lock = threading.Lock()
_gc_holders = 0  # decision steps running with the cyclic collector paused (the loop's and a worker's)
_gc_paused = False  # whether they paused it (it was enabled when the first began)


def _gc_pause() -> None:
    """One more holder of the collector's pause (``cyclic_gc_paused``)."""
    global _gc_holders, _gc_paused
    with _gc_lock:
        if _gc_holders == 0:
            _gc_paused = gc.isenabled()
            if _gc_paused:
                gc.disable()
        _gc_holders += 1


def _gc_resume() -> None:
    """One holder less; the collector is left as it was found when the last one goes."""
    global _gc_holders, _gc_paused
    with _gc_lock:
        _gc_holders -= 1
        if _gc_holders == 0 and _gc_paused:
            gc.enable()
            _gc_paused = False


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Run a step of a decision with Python's cyclic garbage collector paused. A decision allocates many
    short-lived containers (a view's running jobs, the policy's candidate lists: O(queue) at 100,000
    queued); a collection in the middle of it promotes them to the oldest generation, and a few decisions
    later the collector walks the whole state (every record, millions of objects: hundreds of ms). Paused,
    they are freed by reference counting when the step ends, and only what outlives it counts towards a
    collection. The collector is left as it was found when the last step ends."""
    _gc_pause()
    try:
        yield
    finally:
        _gc_resume()


@dataclass(slots=True)
class PendingDecision:
    """A decision in the making: the view it is made on, read from the state by ``Daemon.begin_decision``
    (``prepared``) and built by ``choose`` (``view``: what is O(running jobs) in it is built off the
    event loop when ``choose`` runs in a worker thread)."""

    now: float
    prepared: PreparedView
    layout: Layout
    policy: SchedulingPolicy
    started: float  # time.perf_counter() at the start, for the cycle-time metric
    loads: int  # Daemon.loads when the view was built
    view: ClusterView | None = None
    holds_gc: bool = False  # whether it holds the collector's pause (``begin_decision`` .. ``release``)
    #: ``choose`` may answer ``DEFERRED`` instead of asking the policy when the policy cannot act on the view
    may_defer: bool = False

    def built_view(self) -> ClusterView:
        """The view (built on first use)."""
        if self.view is None:
            self.view = self.prepared.build()[0]
        return self.view

    def release(self) -> None:
        """The decision is done: its view goes (freed by reference counting: O(running jobs) objects), then
        the collector's pause it held. Idempotent; also run when the decision is dropped unfinished."""
        self.view = None
        self.prepared.release()
        if self.holds_gc:
            self.holds_gc = False
            _gc_resume()

    def __del__(self) -> None:
        if self.holds_gc:
            self.holds_gc = False
            _gc_resume()



#: what ``choose`` answers for a decision put off (``PendingDecision.may_defer``): the policy could not have
#: started, stopped or moved anything (``SchedulingPolicy.cannot_act``: no action and no ``wake_at`` whatever
#: the time), so only the queued jobs' reasons would have changed; ``finish_decision`` applies nothing and
#: asks for a pass when the reasons are due (``Daemon.reasons_due``)
DEFERRED = Decision(default_reason="(a decision put off: the policy could not act)")


class DecisionLoop(Timers, PolicySwitch):
    """One pass of the decision loop, in one call or in three steps."""

    def run_once(self) -> float | None:
        """One pass: housekeeping, then (if anything happened or a wake time passed) one decision.
        Returns when the daemon wants the next pass at the latest."""
        pending = self.begin_pass()
        if pending is not None:
            self.finish_decision(pending, self.choose(pending))
        return self.next_pass_at()

    def begin_pass(self) -> PendingDecision | None:
        """The first part of ``run_once``: housekeeping, then the view for a decision if one is due."""
        now = self.housekeeping_pass()
        return None if now is None else self.begin_decision(now)

    def decision_due(self) -> bool:
        """Whether a decision may be made now (``housekeeping_pass`` said one is due, and the runtime
        served requests since: one may have taken the lease away or started a policy switch)."""
        return self.leader and self.policy is not None and self.switch is None and not self._waits_for_nodes()

    def housekeeping_pass(self) -> float | None:
        """Housekeeping (committed), then the model time of the decision due now, or None."""
        self.last_pass = time.monotonic()
        if not self.leader:
            return None
        now = self.clock.now()
        ch = Changes()
        self.housekeeping(now, ch)
        if ch.any() or self._layout_unsaved:  # (a layout chosen for the policy at load is stored here)
            self.commit(ch)
            self.dirty = True
        if self._switch_pending():
            return None
        due = self.wake_at is not None and now >= self.wake_at
        tick = now >= self.last_decide_at + self.config.tick_s * self.speed
        reasons = self.reasons_due is not None and time.monotonic() >= self.reasons_due
        if (self.dirty or due or tick or reasons) and not self._waits_for_nodes():
            return now
        return None

    def _switch_pending(self) -> bool:
        """A policy switch is in progress (``vmctl.daemon.switch``): complete it when it is done, else no
        policy decides (the running jobs run to their end on their hosts; the queue waits)."""
        if self.switch is None:
            return False
        return not self.advance_switch()

    def _waits_for_nodes(self) -> bool:
        """No node registered yet and the policy needs more than the default layout (a gang policy needs
        timeslice rows), or no node carries the layout vmctld lays the cluster out in yet: nothing to decide
        until an agent registers or re-lays its host out (``policy_waiting`` says so)."""
        st = self.state
        if st.cluster_layout is not None and not any(st.layout_ready(n) for n in st.nodes):
            return True  # vmctld lays the cluster out for the policy: no node carries that layout yet
        if st.nodes or self.policy is None:
            return False
        try:
            self.state.offer().check(self.policy)
        except PolicyNeedsUnmet:
            return True
        return False

    def next_pass_at(self) -> float | None:
        """When the daemon wants the next pass at the latest (model time); None when standing by."""
        if not self.leader:
            return None
        nxt = self.last_decide_at + self.config.tick_s * self.speed
        if self.wake_at is not None:
            nxt = min(nxt, self.wake_at)
        return nxt

    def decide(self, now: float) -> Decision:
        pending = self.begin_decision(now)
        return self.finish_decision(pending, self.choose(pending))

    def begin_decision(self, now: float, defer: bool = False) -> PendingDecision:
        """The view of a decision at ``now``, read from the state. ``defer`` (the runtime's decision loop):
        if the policy decided less than ``reasons_defer_s`` ago, ``choose`` may put this decision off when
        the policy cannot act on the view (``DEFERRED``). Issue 27: a burst of batched submissions into a
        cluster with no idle core woke one O(queue) decision after another, each of which could only
        rewrite the queued jobs' reasons."""
        assert self.policy is not None
        started = time.perf_counter()
        may_defer = defer and time.monotonic() < self.full_decision_at + self.reasons_defer_s
        self.dirty = False
        self.last_decide_at = now
        # the collector stays paused from here until the decision is finished (``PendingDecision.release``):
        # the view's objects (a tuple of values per running job, then a ``RunningJob`` each: 20,000 objects
        # at 10,000 running jobs) die with the decision, and a collection between its steps scanned them
        # all, once per step (30-60 ms of a 10,000-node decision, issue 27)
        _gc_pause()
        try:
            prepared = prepare_view(self.state, now)
        except BaseException:
            _gc_resume()
            raise
        return PendingDecision(now=now, prepared=prepared, layout=prepared.lay, policy=self.policy, started=started,
                               loads=self.loads, holds_gc=True, may_defer=may_defer)

    @staticmethod
    def choose(pending: PendingDecision) -> Decision:
        """The policy's decision, checked. Reads only ``pending`` (the view is built for this decision
        from values read at ``begin_decision`` and shares nothing mutable with the daemon's state), so it
        may run in a worker thread."""
        with cyclic_gc_paused():
            view = pending.built_view()
            if pending.may_defer and pending.policy.cannot_act(view):
                return DEFERRED
            decision = pending.policy.decide(view, pending.now)
            check_decision(view, decision, pending.now)
        return decision

    def finish_decision(self, pending: PendingDecision, decision: Decision) -> Decision:
        """Actuate ``decision`` and commit it (``_finish_decision``), the cyclic collector paused; then the
        decision's view is dropped before the pause ends (``PendingDecision.release``)."""
        with cyclic_gc_paused():
            try:
                return self._finish_decision(pending, decision)
            finally:
                pending.release()

    def _finish_decision(self, pending: PendingDecision, decision: Decision) -> Decision:
        """Actuate ``decision`` and commit it. If events came in since ``begin_decision`` (possible when
        ``choose`` ran in a thread), every action is checked against a fresh view of the state as it is
        now; if the state was reloaded, the nodes changed (core numbers may have moved) or the lease was
        lost meanwhile, nothing is applied and the next pass decides again."""
        now = pending.now
        if decision is DEFERRED:  # nothing to apply; the reasons are written by a pass at ``reasons_due``
            self.deferred_decisions += 1
            self.reasons_due = self.full_decision_at + self.reasons_defer_s
            if self.metrics is not None:
                self.metrics.set_queue_length(self.state.queue_length())
            return decision
        self.last_decision = decision
        self.wake_at = decision.wake_at if decision.wake_at is not None and math.isfinite(decision.wake_at) else None
        if self.config.migration.dry_run:
            if decision.actions:
                log.info("dry-run: would apply %s", ", ".join(f"{a.kind} {a.job_id}" for a in decision.actions))
            self.last_result = ApplyResult(skipped=[(a, "dry-run") for a in decision.actions])
            return decision
        view, lay = pending.built_view(), pending.layout
        if not self.leader or self.loads != pending.loads or self.state.layout() is not lay:
            log.info("decision dropped: the state changed under it (reload, node change or lost lease)")
            self.dirty = True
            self.last_result = ApplyResult(skipped=[(a, "state changed during the decision")
                                                    for a in decision.actions])
            return decision
        if self.dirty:
            view, lay = build_view(self.state, now)
        ch = Changes()
        quota = pending.policy.params.get("quota")  # the gang policies' Q, enforced again per slice
        self.actuator.slice_quota = float(quota) if isinstance(quota, int | float) else None
        res = self.actuator.apply(decision, view, lay, now, ch)
        self.last_result = res
        self.skipped_total += len(res.skipped)
        self.commit(ch)
        self.decisions += 1
        self.full_decision_at, self.reasons_due = time.monotonic(), None
        self.decision_seconds.append(time.perf_counter() - pending.started)
        if self.metrics is not None:
            m = self.metrics
            m.observe_cycle(self.decision_seconds[-1])
            for a in res.applied:
                m.decision(a.kind, "applied")
            for a, _why in res.skipped:
                m.decision(a.kind, "rejected")
            m.set_queue_length(self.state.queue_length())
            # (the running-job gauges are counted at a scrape, DaemonServer.render_metrics: O(running jobs),
            # not on every decision)
            m.set_leader(self.leader, self.epoch)
            if view.discipline is Discipline.TIMESLICE:
                doc = matrix_doc(self.state, now)
                m.set_gang(len(doc["rows_in_use"]), int(doc["holes"]))
        if len(self.decision_seconds) > 1000:
            del self.decision_seconds[:500]
        return decision

    def view(self) -> ClusterView:
        return build_view(self.state, self.clock.now())[0]
