"""The one invariant checker for scheduling decisions, used by the daemon, the simulator and the tests.

``check_decision(view, decision, now)`` replays the decision's actions in order against an overlay
of the view (only the cores the actions touch are copied, so a check costs O(actions) plus
O(reasons) plus, unless the view carries a ``queue_index``, a scan of the queue up to the last job
the decision names) and raises ``InvariantViolation`` on the first broken rule:

- a core never gets two fg processes or two bg processes; a usable core only;
- a job starts only from the queue, only once per decision (unless killed in between), and never
  before its submit time; it gets exactly ``procs`` distinct cores;
- Promote: the job runs in bg and every one of its cores has an idle fg slot;
- Migrate/Kill/Checkpoint/SetCap/Suspend/Resume/Demote refer to running jobs (Restore to a
  checkpointed one);
- caps are in (0, 1] or None; ``wake_at`` is not in the past;
- PlaceShared (vcsched): the job is queued (then it counts as started) or running; one known node
  per process; cap in (0, job.cpu_need]; over the decision's PlaceShared actions, no node gets more
  than 1 of CPU caps or 1 of memory (fractions of one node);
- every queued job is accounted for: it is started by an action, or it waits for a reason
  (``decision.reasons`` or ``decision.default_reason``, which must not be empty); reasons name only
  queued jobs that were not started.
"""

from __future__ import annotations

import math
from typing import cast

from vmctl.errors import InvariantViolation
from vmctl.model import (
    Checkpoint,
    ClusterView,
    Decision,
    Demote,
    Job,
    Kill,
    Migrate,
    PlaceShared,
    Promote,
    Restore,
    Resume,
    SetCap,
    StartBg,
    StartFg,
    Suspend,
    Tier,
)

_EPS = 1e-9
# Enum members cached at module level: ``Tier.FG`` is a slow class-attribute lookup on Python 3.11
# and the simulator checks every decision.
_FG = Tier.FG
_BG = Tier.BG


class _Overlay:
    """Copy-on-write occupancy of the fg and bg slots."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self.fg: dict[int, str | None] = {}
        self.bg: dict[int, str | None] = {}

    def get(self, tier: Tier, core: int) -> str | None:
        fg = tier is _FG
        over = self.fg if fg else self.bg
        if core in over:
            return over[core]
        return (self.view.fg_job if fg else self.view.bg_job)[core]

    def put(self, tier: Tier, core: int, job: str | None) -> None:
        (self.fg if tier is _FG else self.bg)[core] = job


def _fail(rule: str, detail: str) -> InvariantViolation:
    return InvariantViolation(rule=rule, detail=detail)


def check_decision(view: ClusterView, decision: Decision, now: float) -> None:
    """Raise ``InvariantViolation`` on the first broken rule (see the module docstring).

    Decisions made only of StartFg/StartBg actions (or of none), by far the most frequent in a
    simulation, take a fast path that applies exactly the same rules in the same order without the
    general overlay machinery; every other decision goes through :func:`_check_general`."""
    actions = decision.actions
    for act in actions:
        t = type(act)
        if t is not StartFg and t is not StartBg:
            _check_general(view, decision, now)
            return
    reasons = decision.reasons
    if actions:
        wanted = {a.job_id for a in actions}
        if reasons:
            wanted.update(reasons.keys())
        queued = _queued_subset(view, wanted)
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
                raise _fail("start-not-queued", f"{act.kind} {jid}: job is not waiting in the queue")
            if job.submit_time > limit:
                raise _fail("start-before-submit", f"{jid} submitted at {job.submit_time}, now {now}")
            if len(cores) != job.procs:
                raise _fail("cores-count", f"{act.kind} {jid}: {len(cores)} cores for {job.procs} processes")
            if len(set(cores)) != len(cores):
                raise _fail("cores-distinct", f"{act.kind} {jid}: a core is listed twice")
            for c in cores:
                if not 0 <= c < total:
                    raise _fail("core-range", f"{act.kind} {jid}: core {c} not in 0..{total - 1}")
                if not usable[c]:
                    raise _fail("core-unusable", f"{act.kind} {jid}: core {c} is not usable")
            if type(act) is StartFg:
                over, base, tname = fg_over, view.fg_job, "fg"
            else:
                over, base, tname = bg_over, view.bg_job, "bg"
            for c in cores:
                other = over[c] if c in over else base[c]
                if other is not None:
                    raise _fail(f"two-{tname}", f"{act.kind} {jid}: {tname} slot of core {c} holds {other}")
            for c in cores:
                over[c] = jid
            started.add(jid)
    elif reasons:
        queued = _queued_subset(view, set(reasons.keys()))
        started = set()
    else:
        queued = {}
        started = set()
    _check_tail(decision, now, queued, started)


def _check_tail(decision: Decision, now: float, queued: dict[str, Job], started: set[str]) -> None:
    """The rules on ``wake_at`` and the reasons, once the actions have been replayed."""
    if decision.wake_at is not None and not (decision.wake_at >= now - _EPS):
        raise _fail("wake-in-past", f"wake_at {decision.wake_at} < now {now}")
    if not decision.default_reason:
        raise _fail("no-reason", "default_reason is empty: waiting jobs must have a reason")
    for jid, reason in decision.reasons.items():
        if jid not in queued or jid in started:
            raise _fail("reason-not-waiting", f"reason given for {jid}, which is not waiting")
        if not reason:
            raise _fail("no-reason", f"empty reason for {jid}")


def _check_general(view: ClusterView, decision: Decision, now: float) -> None:
    ov = _Overlay(view)
    touched = _touched(decision)
    queued = _queued_subset(view, touched | decision.reasons.keys())
    running = {jid: (rj.tier, rj.cores) for jid in touched if (rj := view.running.get(jid)) is not None}
    started: set[str] = set()
    checkpointed: set[str] = set()
    shared: dict[str, list[float]] = {}  # node -> [cpu caps, memory] of PlaceShared in this decision

    def cores_ok(job_id: str, cores: tuple[int, ...], procs: int, action: str) -> None:
        if len(cores) != procs:
            raise _fail("cores-count", f"{action} {job_id}: {len(cores)} cores for {procs} processes")
        if len(set(cores)) != len(cores):
            raise _fail("cores-distinct", f"{action} {job_id}: a core is listed twice")
        for c in cores:
            if not 0 <= c < view.total_cores:
                raise _fail("core-range", f"{action} {job_id}: core {c} not in 0..{view.total_cores - 1}")
            if not view.usable[c]:
                raise _fail("core-unusable", f"{action} {job_id}: core {c} is not usable")

    def place(job_id: str, tier: Tier, cores: tuple[int, ...], action: str) -> None:
        for c in cores:
            other = ov.get(tier, c)
            if other is not None:
                raise _fail(f"two-{tier.value}", f"{action} {job_id}: {tier.value} slot of core {c} holds {other}")
        for c in cores:
            ov.put(tier, c, job_id)

    def vacate(job_id: str) -> tuple[Tier, tuple[int, ...]]:
        tier, cores = running.pop(job_id)
        for c in cores:
            if ov.get(tier, c) == job_id:
                ov.put(tier, c, None)
        return tier, cores

    def need_running(job_id: str, action: str) -> tuple[Tier, tuple[int, ...]]:
        if job_id not in running:
            raise _fail("not-running", f"{action} {job_id}: job is not running")
        return running[job_id]

    for act in decision.actions:
        if isinstance(act, StartFg | StartBg):
            tier = _FG if isinstance(act, StartFg) else _BG
            job = queued.get(act.job_id)
            if job is None or act.job_id in started:
                raise _fail("start-not-queued", f"{act.kind} {act.job_id}: job is not waiting in the queue")
            if job.submit_time > now + _EPS:
                raise _fail("start-before-submit", f"{act.job_id} submitted at {job.submit_time}, now {now}")
            cores_ok(act.job_id, act.cores, job.procs, act.kind)
            place(act.job_id, tier, act.cores, act.kind)
            started.add(act.job_id)
            running[act.job_id] = (tier, act.cores)
        elif isinstance(act, Promote):
            tier, cores = need_running(act.job_id, "promote")
            if tier is not Tier.BG:
                raise _fail("promote-not-bg", f"promote {act.job_id}: job runs in {tier.value}")
            for c in cores:
                if ov.get(Tier.FG, c) is not None:
                    raise _fail("promote-fg-busy", f"promote {act.job_id}: fg slot of core {c} is busy")
            vacate(act.job_id)
            place(act.job_id, Tier.FG, cores, "promote")
            running[act.job_id] = (Tier.FG, cores)
        elif isinstance(act, Demote):
            tier, cores = need_running(act.job_id, "demote")
            if tier is not Tier.FG:
                raise _fail("demote-not-fg", f"demote {act.job_id}: job runs in {tier.value}")
            vacate(act.job_id)
            place(act.job_id, Tier.BG, cores, "demote")
            running[act.job_id] = (Tier.BG, cores)
        elif isinstance(act, Migrate):
            _tier, _cores = need_running(act.job_id, "migrate")
            rj = view.running.get(act.job_id)
            procs = rj.job.procs if rj is not None else len(_cores)
            if act.cost < 0 or not math.isfinite(act.cost):
                raise _fail("migrate-cost", f"migrate {act.job_id}: cost {act.cost}")
            cores_ok(act.job_id, act.cores, procs, "migrate")
            vacate(act.job_id)
            place(act.job_id, act.tier, act.cores, "migrate")
            running[act.job_id] = (act.tier, act.cores)
        elif isinstance(act, Kill):
            need_running(act.job_id, "kill")
            vacate(act.job_id)
            if act.requeue:
                rj = view.running.get(act.job_id)
                if rj is not None:
                    queued[act.job_id] = rj.job
                started.discard(act.job_id)
        elif isinstance(act, Checkpoint):
            need_running(act.job_id, "checkpoint")
            vacate(act.job_id)
            checkpointed.add(act.job_id)
        elif isinstance(act, Restore):
            rj = view.running.get(act.job_id)
            if act.job_id not in checkpointed and not (rj is not None and rj.suspended):
                raise _fail("restore-not-checkpointed", f"restore {act.job_id}: job is not checkpointed")
            procs = rj.job.procs if rj is not None else len(act.cores)
            if act.job_id in running:
                vacate(act.job_id)
            cores_ok(act.job_id, act.cores, procs, "restore")
            place(act.job_id, act.tier, act.cores, "restore")
            checkpointed.discard(act.job_id)
            running[act.job_id] = (act.tier, act.cores)
        elif isinstance(act, SetCap):
            need_running(act.job_id, "set_cap")
            if act.cap is not None and not (0.0 < act.cap <= 1.0 + _EPS):
                raise _fail("cap-range", f"set_cap {act.job_id}: cap {act.cap} not in (0, 1]")
        elif isinstance(act, Suspend | Resume):
            need_running(act.job_id, act.kind)
        elif isinstance(act, PlaceShared):
            _check_place_shared(view, act, queued, running, started, shared, now)
        else:  # pragma: no cover - exhaustive over Action
            raise _fail("unknown-action", repr(act))

    _check_tail(decision, now, queued, started)


def _touched(decision: Decision) -> set[str]:
    return {a.job_id for a in decision.actions}


def _queued_subset(view: ClusterView, wanted: set[str]) -> dict[str, Job]:
    """The queued jobs among ``wanted``: looked up in ``view.queue_index`` when the view has one,
    else found by scanning the queue only up to the last one (the jobs a decision names are usually
    near its front), never indexing the whole queue."""
    out: dict[str, Job] = {}
    left = len(wanted)
    if not left:
        return out
    index = view.queue_index
    if index is not None:
        get = index.get
        for jid in wanted:
            j = get(jid)
            if j is not None:
                out[jid] = j
        return out
    for j in view.queue:
        if j.id in wanted and j.id not in out:
            out[j.id] = j
            left -= 1
            if not left:
                break
    return out


def _check_place_shared(
    view: ClusterView,
    act: PlaceShared,
    queued: dict[str, Job],
    running: dict[str, tuple[Tier, tuple[int, ...]]],
    started: set[str],
    shared: dict[str, list[float]],
    now: float,
) -> None:
    rj = view.running.get(act.job_id)
    if act.job_id in queued and act.job_id not in started:
        job = queued[act.job_id]
        if job.submit_time > now + _EPS:
            raise _fail("start-before-submit", f"{act.job_id} submitted at {job.submit_time}, now {now}")
        started.add(act.job_id)
    elif rj is not None and act.job_id not in started:
        job = rj.job
    else:
        raise _fail("place-shared-unknown", f"place_shared {act.job_id}: job is neither waiting nor running")
    if len(act.nodes) != job.procs:
        raise _fail("cores-count", f"place_shared {act.job_id}: {len(act.nodes)} nodes for {job.procs} processes")
    known = set(view.node_names) | set(view.node_of_core)
    for node in act.nodes:
        if known and node not in known:
            raise _fail("unknown-node", f"place_shared {act.job_id}: node {node!r} is not in the view")
    if not (0.0 < act.cap <= min(1.0, job.cpu_need) + _EPS):
        raise _fail("cap-range", f"place_shared {act.job_id}: cap {act.cap} not in (0, {min(1.0, job.cpu_need)}]")
    for node in act.nodes:
        tot = shared.setdefault(node, [0.0, 0.0])
        tot[0] += act.cap
        tot[1] += job.mem
        if tot[0] > 1.0 + 1e-6:
            raise _fail("node-cpu", f"place_shared {act.job_id}: CPU caps on {node} sum to {tot[0]:.6f} > 1")
        if tot[1] > 1.0 + 1e-6:
            raise _fail("node-memory", f"place_shared {act.job_id}: memory on {node} sums to {tot[1]:.6f} > 1")
