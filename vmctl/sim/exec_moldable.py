"""The moldable execution model: node speed x a moldable job's time at its width (HSRET, paper 002).

A moldable job (:class:`vmctl.model.JobShape`, kind ``moldable``) gets its width when the policy
starts it (``Start`` with that many cores) and keeps it (HSRET sec. 3.1: "the parallelism of the
moldable parallel task cannot be changed in the execution"). Its work is its execution time at that
width on standard resources, ``shape.time_at(width)``; it advances at the speed of the slowest node
among its cores (its processes synchronize, so the slowest one sets the pace; HSRET sec. 6 gives
each cluster's nodes one speed in [0.8, 1.2] of a standard resource). A rigid job (no shape) is the
same with its recorded work (``min(run_time, estimate)``) at ``procs``.

Levels. The model offers ``levels`` VM levels per core (default 1) under the ``shared`` discipline:
with L > 1 the processes on the levels of one core share it as the mock backend's equal-weight VMs do
(:func:`vmctl.cpushare.share_core`: each demands a share of the core, the core is split max-min fairly
among the demands, and a process progresses at its allocation over its demand, times the core's
speed). A rigid or moldable job's process demands the whole core (1.0) while it holds the slot, so
n such processes get ``speed / n`` each; a run's rate is the minimum over its slots. (The task-bag
model's workers demand their task's ``task_usage`` while busy and nothing while idle.)

Nodes. ``speeds`` gives each core's speed (empty: every core 1.0) and ``cores_per_node`` how many
consecutive cores form one node (named ``n0``, ``n1`` ...); ``groups`` names each node's group
(cluster or partition; empty: all ``default``). The policy's view carries them
(``ClusterView.node_speed``/``node_group``/``node_of_core``), so a policy can pick fast nodes or one
cluster as HSRET does.

Forecasts. The shape's times are what the policy is told (``RunningJob.expected_end`` follows them,
as it follows a rigid job's estimate). The workload record says how the job actually runs: at width
``w`` it takes ``time_at(w) * f`` with ``f = min(run_time, estimate) / time_at(procs)``, the record's
run at its recorded width over the forecast there (``f = 1`` when ``procs`` is not a width of the
shape). A hand-made shape whose forecast at ``procs`` is the record's run time runs exactly as
forecast; a trace job made moldable (:mod:`vmctl.sim.workloads.shapes`: forecast = the user's
estimate) runs as long as the trace says at ``procs`` and in proportion at other widths; HSRET's
forecast accuracy rho is a record whose run time exceeds the forecast by up to 5 or 10 %.

Use: ``SimConfig(execution=lambda: MoldableModel(shapes, speeds=...))``; ``vmctl sim run --shapes
moldable`` runs a trace whose jobs were made moldable (:mod:`vmctl.sim.workloads.shapes`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from vmctl.cpushare import share_core
from vmctl.errors import ValidationError
from vmctl.model import DEFAULT_NODE_GROUP, MAX_NODE_SPEED, Discipline, JobShape, group_name_problem
from vmctl.policies.base import Offer
from vmctl.sim.execution import EngineState, ExecutionModel, Run


class MoldableModel(ExecutionModel):
    """Rigid and moldable jobs at node speed (see the module docstring)."""

    name: ClassVar[str] = "moldable"
    #: the job shapes this model executes
    SHAPES: ClassVar[frozenset[str]] = frozenset({"rigid", "moldable"})

    def __init__(self, shapes: Mapping[str, JobShape] | None = None, speeds: Sequence[float] = (),
                 cores_per_node: int = 1, groups: Sequence[str] = (), levels: int = 1) -> None:
        super().__init__()
        self._factor: dict[int, float] = {}
        if levels < 1:
            raise ValidationError(field="levels", problem=f"must be >= 1, got {levels}")
        if cores_per_node < 1:
            raise ValidationError(field="cores_per_node", problem=f"must be >= 1, got {cores_per_node}")
        for i, s in enumerate(speeds):
            if isinstance(s, bool) or not isinstance(s, int | float) or not 0 < s <= MAX_NODE_SPEED:
                raise ValidationError(field=f"speeds[{i}]", problem=f"must be in (0, {MAX_NODE_SPEED:g}], got {s!r}")
        for i, g in enumerate(groups):
            problem = group_name_problem(g)
            if problem is not None:
                raise ValidationError(field=f"groups[{i}]", problem=problem)
        for jid, shape in (shapes or {}).items():
            if shape.kind not in self.SHAPES:
                raise ValidationError(field=f"job {jid}.shape",
                                      problem=f"the {self.name} model does not execute {shape.kind} jobs")
        self.shapes.update(shapes or {})
        self.levels = levels
        self._speeds = [float(s) for s in speeds]
        self._cores_per_node = cores_per_node
        self._groups = list(groups)

    def offer(self) -> Offer:
        return Offer(where=self.where(), levels=self.levels, discipline=Discipline.SHARED,
                     shapes=self.SHAPES)

    def nodes(self, cores: int) -> Mapping[str, Any]:
        """The view's nodes: ``cores_per_node`` consecutive cores per node ``n0``, ``n1`` ..., each with
        its speed and group."""
        if self._speeds and len(self._speeds) != cores:
            raise ValidationError(field="speeds", problem=f"{len(self._speeds)} speeds for {cores} cores")
        speeds = self._speeds or [1.0] * cores
        per = self._cores_per_node
        count = (cores + per - 1) // per
        if self._groups and len(self._groups) != count:
            raise ValidationError(field="groups", problem=f"{len(self._groups)} groups for {count} nodes")
        names = [f"n{k}" for k in range(count)]
        speed: dict[str, float] = {}
        group: dict[str, str] = {}
        for k, name in enumerate(names):
            node_speeds = speeds[k * per:(k + 1) * per]
            if len(set(node_speeds)) != 1:
                raise ValidationError(field="speeds", problem=f"the cores of node {name} (cores {k * per}.."
                                                              f"{k * per + len(node_speeds) - 1}) differ in speed")
            speed[name] = node_speeds[0]
            group[name] = self._groups[k] if self._groups else DEFAULT_NODE_GROUP
        self.core_speed: list[float] = speeds
        return {"node_of_core": [names[c // per] for c in range(cores)],
                "local_core": [c % per for c in range(cores)], "node_names": names, "node_speed": speed,
                "node_group": group}

    def bind(self, state: EngineState) -> None:
        super().bind(state)
        if not hasattr(self, "core_speed"):
            self.nodes(state.cores)
        self._slot_run = state.slot_run

    # ------------------------------------------------------------------ the contract

    def work(self, run: Run) -> float:
        """A moldable job's actual time at the width it started with; a rigid job's recorded work."""
        shape = self.shapes.get(run.job.id)
        if shape is None or shape.kind != "moldable":
            return self.state.job_work[run.idx]
        return shape.time_at(run.width) * self.actual_factor(run)

    def actual_factor(self, run: Run) -> float:
        """How the job actually runs against its shape's forecast: the record's work at its recorded
        width ``procs`` over the shape's time there (1 when ``procs`` is not a width of the shape)."""
        idx = run.idx
        f = self._factor.get(idx)
        if f is None:
            shape = self.shapes[run.job.id]
            procs = run.job.procs
            forecast = shape.time_at(procs) if shape.allows(procs) else 0.0
            f = self._factor[idx] = self.state.job_work[idx] / forecast if forecast > 0.0 else 1.0
        return f

    def slot_demand(self, run: Run, core: int, level: int) -> float:
        """What ``run``'s process on (core, level) demands of the core: a rigid or moldable job's
        process is CPU-bound (1.0) while it holds the slot."""
        return 1.0

    def slot_rate(self, core: int, level: int) -> float:
        """What the process on (core, level) gets, in work seconds per second: with several levels the
        core's speed split among the demands of the processes on its levels (not stopped) as the mock
        backend splits it (:func:`vmctl.cpushare.share_core`, equal weights), over the slot's own
        demand. When every demand is a whole core, that is ``speed / holders``. A slot demanding
        nothing (an idle worker) is given what a lone process would get."""
        speed = self.core_speed[core]
        if self.levels == 1:
            return speed
        demands: list[float] = []
        mine = -1
        for lv, row in enumerate(self._slot_run):
            r = row[core]
            if r is None or r.stopped:
                continue
            d = self.slot_demand(r, core, lv)
            if d > 0.0:
                if lv == level:
                    mine = len(demands)
                demands.append(d)
        if mine < 0 or len(demands) == 1:
            return speed
        if demands.count(1.0) == len(demands):  # CPU-bound processes only: equal shares
            return speed / len(demands)
        alloc = share_core([(1, d) for d in demands], 1.0)
        return speed * alloc[mine] / demands[mine]

    def rate(self, run: Run) -> float:
        """The slowest of the run's processes sets its pace."""
        level = run.level
        return min(self.slot_rate(c, level) for c in run.cores)

    def affected(self, level: int, cores: Collection[int]) -> Iterable[Run]:
        """With several levels, the runs on the other levels of changed cores (their share changed)."""
        if self.levels == 1:
            return ()
        out: dict[int, Run] = {}
        for other, slots in enumerate(self._slot_run):
            if other == level:
                continue
            for c in cores:
                r = slots[c]
                if r is not None:
                    out[r.idx] = r
        return out.values()

    def known_work(self, run: Run) -> float:
        """The work the policy was told the run needs: a moldable job's time at its width (the
        shape's forecast), a rigid job's estimate."""
        shape = self.shapes.get(run.job.id)
        if shape is None or shape.kind != "moldable":
            return run.job.estimate
        return shape.time_at(run.width)

    def expected_end(self, run: Run, now: float) -> float:
        """When the run ends at its current rate if it needs what the policy was told
        (:meth:`known_work`): ``max(now, blocked) + debt + (known - progress) / rate``; ``inf`` while
        it does not advance."""
        if run.stopped or run.rate <= 0.0:
            return float("inf")
        begin = run.blocked_until if run.blocked_until > now else now
        return begin + run.debt + max(0.0, self.known_work(run) - run.progress_at(now)) / run.rate
