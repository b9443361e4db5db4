"""The one invariant checker for scheduling decisions, used by the daemon, the simulator and the tests.

``check_decision(view, decision, now)`` replays the decision's actions in order on the one occupancy
model (:mod:`vmctl.policies.occupancy`, a copy-on-write overlay of the view: only the cores and jobs
the actions touch are copied, so a check costs O(actions) plus O(reasons) plus, unless the view
carries a ``queue_index``, a scan of the queue up to the last job the decision names) and raises
``InvariantViolation`` on the first broken rule:

- no level of a core holds two jobs (``two-fg``, ``two-bg``, ``two-on-level``); usable cores and
  existing levels only;
- a job starts only from the queue, only once per decision (unless killed in between), and never
  before its submit time; it gets exactly ``procs`` distinct cores (rigid: width = procs);
- Promote: the job runs in bg and every one of its cores has an idle fg slot;
- Migrate/Move/Kill/Checkpoint/SetCap/Suspend/Resume/Demote refer to running jobs (Restore to a
  checkpointed one); no double suspend, no resume of a job that is not suspended, and none of a
  checkpointed one (``resume-checkpointed``: it holds no slots, Restore/Move brings it back);
- caps are in (0, 1] or None; ``wake_at`` is not in the past; a time-slice schedule needs the
  timeslice discipline, a positive period and distinct rows;
- PlaceShared (vcsched): the job is queued (then it counts as started) or running; one known node
  per process; cap in (0, min(1, job.cpu_need)] (a fraction of one core: a VM is one vCPU); at the end
  of the decision no node it touched carries more CPU caps than its cores (``node_of_core``) or more
  than 1 of memory (a fraction of the node), *counting the shared VMs already placed* (and their caps
  as SetCap leaves them);
- every queued job is accounted for: it is started by an action, or it waits for a reason
  (``decision.reasons`` or ``decision.default_reason``, which must not be empty); reasons name only
  queued jobs that were not started.

``check_decision`` returns the overlay: its ``effects`` (:mod:`vmctl.policies.effects`) say what each
action did, in order, for the caller to commit (the simulator's engines, vmctld's actuator).

Decisions made only of starts on free slots (StartFg, and StartBg on a view of two levels or more),
by far the most frequent in a simulation, can be checked by a fast path instead (:func:`accepts_fast`,
which the simulator's two-tier engine calls first): it only *accepts*, and builds no overlay. It
tests, per start and in C-level set operations where it can, the very conditions under which the
general replay accepts that start (job queued and not started yet in this decision, submitted,
``procs`` distinct cores, each in range, usable, with its slot free in the view and not taken by an
earlier start of the decision), plus the reasons and ``wake_at`` rules. When any of them fails it
says "not shown here" and the caller hands the whole decision to :func:`check_decision`, which names
the first broken rule (``tests/unit/test_invariants_fast_path.py`` checks, over generated views and
decisions, that the fast path accepts only what the general replay accepts).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from vmctl.model import ClusterView, Decision, Job, StartBg, StartFg
from vmctl.policies.occupancy import EPS, Occupancy, check_schedule, fail, queued_subset

_EPS = EPS


def check_decision(view: ClusterView, decision: Decision, now: float) -> Occupancy:
    """Raise ``InvariantViolation`` on the first broken rule (see the module docstring); else return
    the overlay the replay left, whose ``effects`` say what each action did, in order (callers commit
    them: :mod:`vmctl.policies.effects`)."""
    return _check_general(view, decision, now)


def accepts_fast(view: ClusterView, decision: Decision, now: float) -> bool:
    """True when :func:`check_decision` would accept ``decision``, tested without replaying it: a
    decision of starts on free slots only (StartFg, StartBg with two levels or more; no schedule, no
    shapes). False means "not shown here", never "refused". Its effects are then known without the
    overlay: each start is STARTED on its cores at level 0 (StartFg) or 1 (StartBg), in order (the
    simulator's two-tier engine applies such decisions directly;
    ``tests/unit/test_effects.py`` checks that this agrees with the effects of the replay)."""
    if decision.schedule is not None or view.shapes:
        return False
    actions = decision.actions
    reasons = decision.reasons
    if decision.wake_at is not None and not (decision.wake_at >= now - _EPS):
        return False
    if not decision.default_reason:
        return False
    index: Mapping[str, Job] | None = view.queue_index
    if index is None:
        wanted = {a.job_id for a in actions}
        if reasons:
            wanted.update(reasons.keys())
        index = queued_subset(view, wanted)
    if actions:
        bg_ok = view.levels >= 2
        started: set[str] = set()
        taken_fg: set[int] = set()
        taken_bg: set[int] = set()
        total = view.total_cores
        usable = view.usable
        limit = now + _EPS
        get = index.get
        for act in actions:
            t = type(act)
            if t is StartFg:
                base = view.fg_job
                taken = taken_fg
            elif t is StartBg and bg_ok:
                base = view.bg_job
                taken = taken_bg
            else:
                return False
            start = cast("StartFg | StartBg", act)  # by the type test above
            jid = start.job_id
            cores = start.cores
            job = get(jid)
            if job is None or jid in started or job.submit_time > limit or len(cores) != job.procs:
                return False
            cs = set(cores)
            if len(cs) != len(cores) or not taken.isdisjoint(cs):
                return False
            for c in cores:
                if not 0 <= c < total or not usable[c] or base[c] is not None:
                    return False
            taken |= cs
            started.add(jid)
        for jid, reason in reasons.items():
            if not reason or jid in started or jid not in index:
                return False
    else:
        for jid, reason in reasons.items():
            if not reason or jid not in index:
                return False
    return True


def _check_tail(decision: Decision, now: float, queued: dict[str, Job], started: set[str]) -> None:
    """The rules on ``wake_at`` and the reasons, once the actions have been replayed."""
    if decision.wake_at is not None and not (decision.wake_at >= now - _EPS):
        raise fail("wake-in-past", f"wake_at {decision.wake_at} < now {now}")
    if not decision.default_reason:
        raise fail("no-reason", "default_reason is empty: waiting jobs must have a reason")
    for jid, reason in decision.reasons.items():
        if jid not in queued or jid in started:
            raise fail("reason-not-waiting", f"reason given for {jid}, which is not waiting")
        if not reason:
            raise fail("no-reason", f"empty reason for {jid}")


def _check_general(view: ClusterView, decision: Decision, now: float) -> Occupancy:
    """Replay the actions on an :class:`~vmctl.policies.occupancy.Occupancy` overlay of the view."""
    queued = queued_subset(view, {a.job_id for a in decision.actions} | decision.reasons.keys())
    occ = Occupancy(view, queued, now)
    for act in decision.actions:
        occ.apply(act)
    occ.check_capacity()
    if decision.schedule is not None:
        check_schedule(view, decision.schedule)
    _check_tail(decision, now, occ.queued, occ.started)
    return occ
