"""``moldable``: paper 002's methods (HSRET, AFCFS, ALL-EFT, CBSP; ``vmctl.policies.moldable``) as a
registered scheduling policy, so that vmctld runs them on real hosts (issue 13, "On real hosts").

HSRET paper (``shared/seeds/002_*.txt``) sec. 3.2: time runs in slots of SL; decisions happen at slot
boundaries; the width and cluster of a task are chosen when it starts and never change; at the end of
a slot the sub-tasks of a started task may be suspended and resumed later. This module translates a
:class:`~vmctl.model.ClusterView` into the methods' :class:`~vmctl.policies.moldable.model.SlotView`
and their answer back into actions, running the methods' code unchanged:

- **Clusters are node groups.** Each group registered by the agents (``host.group``; ``default``
  when none is given) is one cluster; its nodes are the group's usable cores (one core = one of the
  paper's nodes, as a VM per core is vmctld's unit); its speed is the slowest ``host.speed`` among
  the group's nodes (the paper has one speed per cluster; the slowest makes a forecast safe).
- **Tasks are jobs.** A queued or running job with a ``moldable`` shape is a task with its widths and
  times (seconds on a standard core: the shape's table or speedup model); a rigid job is a task of
  one width, ``procs``, taking its ``estimate``. Its deadline is the job's ``deadline``, or, for a job
  without one, ``submit + deadline_estimates x estimate`` (the same rule as the trace evaluation,
  ``vmctl.experiments.moldable_traces``). A running job's remaining slots are its time at its width
  over its group's speed, less its progress, in slots (at least 1).
- **Slots.** ``slot`` seconds (> 0). The policy acts at the first decision pass of each slot (the
  daemon's clock, slot k = [k SL, (k + 1) SL)) and asks for a pass at the next boundary
  (``wake_at``) while a job is queued or running; a pass within a slot it has already decided returns
  no action (jobs submitted meanwhile wait for the boundary, as in the paper, where tasks are seen at
  the next slot). An idle cluster asks for no wake-up: the first pass after an arrival then decides at
  once (it is the first pass of its slot).
- **Actions.** A method's ``Start(task, cluster, width)`` becomes ``Start(job, cores, level 0)`` on
  ``width`` free level-0 cores of that group (whole nodes first: the nodes with the most free cores);
  a running job the method does not run this slot is suspended (``Suspend``: its VMs are paused by the
  agents, its progress stops), and resumed (``Resume``) at the boundary of a slot where it runs.
- **Why.** Each start's reason says the width, the group and speed, the method's rule and whether the
  forecast end meets the deadline (``Start.reason``; vmctld stores it with the job and ``vmctl job
  show`` prints it).

Readings we chose (vmctld, not the paper): a suspended job's VMs are paused, not checkpointed, so its
cores stay its own (the occupancy model keeps a paused VM's slot); a method that puts another task on
them in the same slot (HSRET's Sch1 frees nodes by suspending) gets that start refused here and the
task waits for a later boundary (its reason says so). A running job whose cores span groups (placed by
another policy) or sits on another level keeps its cores out of every group's capacity.

Tiny example: groups ``slow`` (4 cores, speed 1.0) and ``fast`` (4 cores, speed 2.0), SL 60 s, AFCFS, a
job with table {2: 240, 4: 120} s and deadline 150 s after submission at 0: at the boundary 0, width 2
needs ceil(240 / 60) = 4 slots on ``slow`` (ends 240 > 150) and 2 on ``fast`` (ends 120); width 4 needs
2 slots on ``slow`` and 1 on ``fast``; both groups qualify, one is drawn, and there the smallest width
that meets the deadline: width 2 on ``fast`` (or 4 on ``slow``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from vmctl.errors import PolicyParameterError, ValidationError
from vmctl.model import ClusterView, Decision, Job, JobShape, Resume, RunningJob, Start, Suspend
from vmctl.policies.base import Needs, SchedulingPolicy
from vmctl.policies.moldable import MOLDABLE_POLICIES, make_policy
from vmctl.policies.moldable.model import Clusters, MoldablePolicy, Profile, SlotView
from vmctl.policies.moldable.model import Decision as SlotDecision
from vmctl.policies.registry import register

RULES = {
    "hsret": "HSRET: the width of the common normalized time set by the load, corrected for the deadline",
    "afcfs": "AFCFS: the smallest width that ends by the deadline, in a group drawn among those where one fits",
    "all-eft": "ALL-EFT: the earliest finish over every group and width",
    "cbsp": "CBSP: the group with the most free cores x speed, the largest width within the job's share of "
            "the free cores",
    "hsret-afcfs": "HSRET from AFCFS's list: AFCFS's start, widened towards the width of the common normalized "
                   "time where the list leaves cores",
    "all-eft-cap": "ALL-EFT capped by the load: the earliest finish over every group and the widths the load "
                   "allows",
}


def duration(seconds: float) -> str:
    """``95`` -> ``1m 35s``; ``7260`` -> ``2h 1m`` (human-readable, for reasons)."""
    s = round(abs(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    text = f"{h}h {m}m" if h else f"{m}m {sec}s" if m else f"{sec}s"
    return ("-" if seconds < 0 else "") + text


def profile_of(job: Job, shape: JobShape | None) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(widths, times in seconds on a standard core) of a job: its moldable shape, or ``procs`` at its
    estimate for a rigid job."""
    if shape is not None and shape.kind == "moldable":
        return tuple(shape.widths), tuple(float(t) for t in shape.times)
    return (job.procs,), (float(job.estimate),)


def check_moldable_shape(shape: JobShape | None, where: str) -> None:
    """What the methods need of a shape beyond what :mod:`vmctl.shapes` checks: times that do not grow
    with the width (eq. 7; the field is ``WHERE.times[j]``)."""
    if shape is None or shape.kind != "moldable":
        return
    try:
        Profile("job", tuple(shape.widths), tuple(float(t) for t in shape.times))
    except ValidationError as exc:
        sub = str(exc.fields["field"]).removeprefix("shape.")
        raise ValidationError(field=f"{where}.{sub}".lstrip("."), problem=exc.fields["problem"]) from None


@register
class MoldableSlots(SchedulingPolicy):
    name: ClassVar[str] = "moldable"
    summary: ClassVar[str] = ("paper 002's moldable methods (hsret, afcfs, all-eft, cbsp) on node groups: width and "
                              "group per job, suspend and resume at slot boundaries")
    parameters: ClassVar[Mapping[str, tuple[type, Any, str]]] = {
        "method": (str, "hsret", "hsret, afcfs, all-eft or cbsp; hsret-afcfs or all-eft-cap "
                                 "(vmctl.policies.moldable)"),
        "slot": (float, 60.0, "slot length SL in seconds (> 0): starts, suspends and resumes happen at its boundaries"),
        "deadline_estimates": (float, 3.0, "a job without a deadline gets submit + this x its estimate (> 0)"),
        "seed": (int, 1, "seed of AFCFS's random group"),
    }
    needs: ClassVar[Needs] = Needs(levels=1, shapes=frozenset({"rigid", "moldable"}))
    job_fields = frozenset({"deadline"})

    def validate_params(self) -> None:
        p = self.params
        if p["method"] not in MOLDABLE_POLICIES:
            raise PolicyParameterError(policy=self.name, param="method",
                                       problem=f"must be one of {', '.join(MOLDABLE_POLICIES)}, got {p['method']!r}")
        for key in ("slot", "deadline_estimates"):
            if not (math.isfinite(p[key]) and p[key] > 0):
                raise PolicyParameterError(policy=self.name, param=key, problem=f"must be > 0, got {p[key]!r}")
        self._method: MoldablePolicy = make_policy(p["method"], np.random.default_rng(p["seed"]))
        self._decided: int | None = None  # the slot decided last

    def check_job(self, job: Job, shape: JobShape | None, where: str) -> None:
        check_moldable_shape(shape, f"{where}.shape".lstrip("."))

    def deadline_of(self, job: Job) -> float:
        if job.deadline is not None:
            return max(float(job.deadline), job.submit_time + 1e-6)
        return job.submit_time + float(self.params["deadline_estimates"]) * job.estimate

    def decide(self, view: ClusterView, now: float) -> Decision:
        sl = float(self.params["slot"])
        k = math.floor(now / sl + 1e-9)
        nxt = (k + 1) * sl
        if not view.queue and not view.running:
            return Decision()  # nothing to decide: no wake-up (an arrival brings the next pass)
        if self._decided == k:
            return Decision(wake_at=nxt, default_reason=f"waits for the next slot boundary (in {duration(nxt - now)})")
        self._decided = k
        return _Translation(self, view, now, k, sl).decision(nxt)


class _Translation:
    """One slot's view for the method, and its answer as actions (module docstring)."""

    def __init__(self, pol: MoldableSlots, view: ClusterView, now: float, k: int, sl: float) -> None:
        self.pol, self.view, self.now, self.sl = pol, view, now, sl
        names = sorted({view.group_of(view.node(c)) for c in range(view.total_cores) if view.usable[c]})
        self.groups = names
        gi = {g: i for i, g in enumerate(names)}
        self.group_cores: list[list[int]] = [[] for _ in names]
        for c in range(view.total_cores):
            if view.usable[c]:
                self.group_cores[gi[view.group_of(view.node(c))]].append(c)
        speeds = [min(view.speed_of(view.node(c)) for c in cores) for cores in self.group_cores]
        nodes = [len(cores) for cores in self.group_cores]
        profiles: dict[tuple[tuple[int, ...], tuple[float, ...]], int] = {}
        self.profiles: list[Profile] = []
        #: jobs the methods cannot take (a table whose time grows with the width, queued before this
        #: policy was active): job id -> why; a queued one waits with that reason, a running one's
        #: cores are out of the groups' capacity
        self.unfit: dict[str, str] = {}

        def task(job: Job) -> tuple[int, float] | None:
            widths, times = profile_of(job, view.shapes.get(job.id))
            key = (widths, tuple(t / times[0] for t in times))
            if key not in profiles:
                try:
                    made = Profile(f"p{len(self.profiles)}", widths, key[1])
                except ValidationError as exc:
                    self.unfit[job.id] = (f"the moldable methods cannot take this job: {exc} (submitted before "
                                          "policy moldable was active; requeue it with a table whose time does "
                                          "not grow with the width)")
                    return None
                profiles[key] = len(self.profiles)
                self.profiles.append(made)
            return profiles[key], times[0]

        self.active: list[RunningJob] = []
        cols: list[list[float]] = [[] for _ in range(8)]
        for rj in view.running.values():
            gs = {gi.get(view.group_of(view.node(c)), -1) for c in rj.cores}
            t = task(rj.job) if rj.level == 0 and len(gs) == 1 and -1 not in gs else None
            if t is None:
                for g in gs - {-1}:  # not a task: its cores are out of the groups' capacity
                    nodes[g] -= sum(1 for c in rj.cores if gi.get(view.group_of(view.node(c))) == g)
                continue
            g = gs.pop()
            pi, length = t
            p = self.profiles[pi]
            minutes = length * float(p.r[p.index(rj.width)]) / speeds[g] if rj.width in p.widths else length
            rem = max(1, math.ceil((minutes - rj.progress) / sl - 1e-9))
            self.active.append(rj)
            for col, v in zip(cols, (rj.job.submit_time, self.pol.deadline_of(rj.job), length, pi, g, rj.width, rem,
                                     int(rj.suspended)), strict=True):
                col.append(v)
        tasks = [(j, task(j)) for j in view.queue]
        self.queue: Sequence[Job] = [j for j, t in tasks if t is not None]
        self.waiting_unfit = {j.id: self.unfit[j.id] for j, t in tasks if t is None}
        w = [t for _j, t in tasks if t is not None]
        self.clusters = Clusters(tuple(max(0, n) for n in nodes) or (0,), tuple(speeds) or (1.0,))
        f64 = np.float64
        i64 = np.int64
        self.suspended = np.array(cols[7], dtype=bool)
        self.slot_view = SlotView(
            now=k, slot=sl, clusters=self.clusters, profiles=tuple(self.profiles),
            w_id=np.arange(len(self.queue), dtype=i64),
            w_arrival=np.array([j.submit_time for j in self.queue], dtype=f64),
            w_deadline=np.array([self.pol.deadline_of(j) for j in self.queue], dtype=f64),
            w_length=np.array([x[1] for x in w], dtype=f64), w_profile=np.array([x[0] for x in w], dtype=i64),
            a_id=np.arange(len(self.queue), len(self.queue) + len(self.active), dtype=i64),
            a_arrival=np.array(cols[0], dtype=f64), a_deadline=np.array(cols[1], dtype=f64),
            a_length=np.array(cols[2], dtype=f64), a_profile=np.array(cols[3], dtype=i64),
            a_cluster=np.array(cols[4], dtype=i64), a_width=np.array(cols[5], dtype=i64),
            a_rem=np.array(cols[6], dtype=i64))

    def decision(self, nxt: float) -> Decision:
        view = self.view
        if not self.groups:
            return Decision(wake_at=nxt, default_reason="no usable cores")
        ans: SlotDecision = self.pol._method.decide(self.slot_view)
        actions: list[Any] = []
        running = np.asarray(ans.running, dtype=bool)
        for rj, run, susp in zip(self.active, running, self.suspended, strict=True):
            if susp and run:
                actions.append(Resume(rj.job.id))
            elif not susp and not run:
                actions.append(Suspend(rj.job.id))
        free = [sorted(c for c in cores if c in view.idle[0]) for cores in self.group_cores]
        reasons: dict[str, str] = dict(self.waiting_unfit)
        for s in ans.starts:
            job = self.queue[s.task]
            cores = self._take(free[s.cluster], s.width)
            if cores is None:
                reasons[job.id] = (f"{self.pol.params['method']} chose width {s.width} in group "
                                   f"{self.groups[s.cluster]}, but its free cores are held by paused jobs: waits "
                                   f"for the next slot boundary (in {duration(nxt - self.now)})")
                continue
            actions.append(Start(job.id, cores, 0, reason=self._why(job, s.task, s.cluster, s.width, ans)))
        return Decision(tuple(actions), wake_at=nxt, reasons=reasons,
                        default_reason=f"{self.pol.params['method']}: not started at this slot boundary; "
                                       f"next one in {duration(nxt - self.now)}")

    def _take(self, free: list[int], width: int) -> tuple[int, ...] | None:
        """``width`` of the group's free cores, from the nodes with the most free cores first (fewest
        nodes per job); removed from ``free``. None when fewer are free."""
        if len(free) < width:
            return None
        by_node: dict[str, list[int]] = {}
        for c in free:
            by_node.setdefault(self.view.node(c), []).append(c)
        picked: list[int] = []
        for node in sorted(by_node, key=lambda n: (-len(by_node[n]), n)):
            picked.extend(by_node[node][: width - len(picked)])
            if len(picked) == width:
                break
        for c in picked:
            free.remove(c)
        return tuple(sorted(picked))

    def _why(self, job: Job, task: int, cluster: int, width: int, ans: SlotDecision) -> str:
        sv = self.slot_view
        p = self.profiles[int(sv.w_profile[task])]
        speed = self.clusters.speed[cluster]
        n = int(sv.slots_needed(float(sv.w_length[task]), p)[cluster, p.index(width)])
        end = (sv.now + n) * self.sl
        dl = float(sv.w_deadline[task])
        method = str(self.pol.params["method"])
        extra = ""
        if method in ("hsret", "hsret-afcfs") and "snet" in ans.notes:
            ref = p.widths[p.index_for_net(float(ans.notes["snet"]))]
            extra = (f"; normalized time {ans.notes['snet']:.2f} (load case {int(ans.notes.get('case', 0))}) "
                     f"gives width {ref}" + ("" if ref == width else f", moved to {width} for the deadline or to save "
                                                                     "node-slots"))
        fate = (f"meets the deadline (in {duration(dl - self.now)}) with {duration(dl - end)} to spare"
                if end <= dl + 1e-6 else f"misses the deadline (in {duration(dl - self.now)}) by "
                                         f"{duration(end - dl)}: no width and group meets it")
        src = "deadline" if job.deadline is not None else \
            f"no deadline given: submit + {self.pol.params['deadline_estimates']:g} x estimate"
        return (f"width {width} of {list(p.widths)} in group {self.groups[cluster]} (speed {speed:g}): "
                f"{RULES[method]}{extra}; {n} slot(s) of {duration(self.sl)} -> {fate} ({src})")
