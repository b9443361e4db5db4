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
  checkpointed one); no double suspend, no resume of a job that is not suspended;
- caps are in (0, 1] or None; ``wake_at`` is not in the past; a time-slice schedule needs the
  timeslice discipline, a positive period and distinct rows;
- PlaceShared (vcsched): the job is queued (then it counts as started) or running; one known node
  per process; cap in (0, job.cpu_need]; at the end of the decision no node it touched carries more
  than 1 of CPU caps or 1 of memory (fractions of one node), *counting the shared VMs already
  placed* (and their caps as SetCap leaves them);
- every queued job is accounted for: it is started by an action, or it waits for a reason
  (``decision.reasons`` or ``decision.default_reason``, which must not be empty); reasons name only
  queued jobs that were not started.

StartFg/StartBg-only decisions (the simulator's hot path) take a fast path: the same start rules,
specialized to levels 0 and 1 without the overlay object.
"""

from __future__ import annotations

from typing import cast

from vmctl.model import ClusterView, Decision, Job, StartBg, StartFg
from vmctl.policies.occupancy import EPS, Occupancy, check_schedule, fail, queued_subset

_EPS = EPS


def check_decision(view: ClusterView, decision: Decision, now: float) -> None:
    """Raise ``InvariantViolation`` on the first broken rule (see the module docstring).

    Decisions made only of StartFg/StartBg actions (or of none), by far the most frequent in a
    simulation, take a fast path that applies exactly the same rules in the same order without the
    general overlay machinery; every other decision goes through :func:`_check_general`."""
    actions = decision.actions
    for act in actions:
        t = type(act)
        if t is not StartFg and (t is not StartBg or view.levels < 2):
            _check_general(view, decision, now)
            return
    if decision.schedule is not None or view.shapes:  # moldable/task-bag widths: the general rules
        _check_general(view, decision, now)
        return
    reasons = decision.reasons
    if actions:
        wanted = {a.job_id for a in actions}
        if reasons:
            wanted.update(reasons.keys())
        queued = queued_subset(view, wanted)
        started: set[str] = set()
        fg_over: dict[int, str] = {}
        bg_over: dict[int, str] = {}
        total = view.total_cores
        usable = view.usable
        limit = now + _EPS
        for any_act in actions:
            act = cast("StartFg | StartBg", any_act)  # checked by the loop above
            jid = act.job_id
            cores = act.cores
            job = queued.get(jid)
            if job is None or jid in started:
                raise fail("start-not-queued", f"{act.kind} {jid}: job is not waiting in the queue")
            if job.submit_time > limit:
                raise fail("start-before-submit", f"{jid} submitted at {job.submit_time}, now {now}")
            if len(cores) != job.procs:
                raise fail("cores-count", f"{act.kind} {jid}: {len(cores)} cores for {job.procs} processes")
            if len(set(cores)) != len(cores):
                raise fail("cores-distinct", f"{act.kind} {jid}: a core is listed twice")
            for c in cores:
                if not 0 <= c < total:
                    raise fail("core-range", f"{act.kind} {jid}: core {c} not in 0..{total - 1}")
                if not usable[c]:
                    raise fail("core-unusable", f"{act.kind} {jid}: core {c} is not usable")
            if type(act) is StartFg:
                over, base, tname = fg_over, view.fg_job, "fg"
            else:
                over, base, tname = bg_over, view.bg_job, "bg"
            for c in cores:
                other = over[c] if c in over else base[c]
                if other is not None:
                    raise fail(f"two-{tname}", f"{act.kind} {jid}: {tname} slot of core {c} holds {other}")
            for c in cores:
                over[c] = jid
            started.add(jid)
    elif reasons:
        queued = queued_subset(view, set(reasons.keys()))
        started = set()
    else:
        queued = {}
        started = set()
    _check_tail(decision, now, queued, started)


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


def _check_general(view: ClusterView, decision: Decision, now: float) -> None:
    """Replay the actions on an :class:`~vmctl.policies.occupancy.Occupancy` overlay of the view."""
    queued = queued_subset(view, {a.job_id for a in decision.actions} | decision.reasons.keys())
    occ = Occupancy(view, queued, now)
    for act in decision.actions:
        occ.apply(act)
    occ.check_capacity()
    if decision.schedule is not None:
        check_schedule(view, decision.schedule)
    _check_tail(decision, now, occ.queued, occ.started)
