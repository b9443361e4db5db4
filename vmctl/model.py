"""The scheduling vocabulary of vmctl: jobs, the cluster view a policy sees, the actions it may take,
and the decisions that carry them. (The desired/observed documents exchanged between the daemon and
the node agents are ``vmctl.nodedoc``.)

Everything here is a frozen dataclass (or an enum) with no behaviour beyond validation and small
derived properties. Policies, the simulator, the daemon and the agents all speak this language.

Cores are identified by a global integer index ``0 .. total_cores-1``. ``ClusterView.node_of_core``
maps a core to the node (physical host) that carries it, and ``ClusterView.local_core`` to its index
on that node, so a policy can reason about whole nodes when it needs to (migration, vcsched hosts).

Levels. Each physical core carries ``L`` VM slots, its *levels*, numbered ``0 .. L-1``, under one
``Discipline`` per cluster:

- ``priority`` (the MEASY family, L = 2): level 0 is the foreground (fg) slot with the highest CPU
  priority, level 1 the background (bg) slot with the lowest (MEASY paper sec. 2.1). ``fg``/``bg``
  (``Tier``, ``ClusterView.fg_job``/``bg_job``/``idle_fg``/``idle_bg``) stay the names of levels 0
  and 1, so the EASY family reads as it always did;
- ``timeslice`` (gang scheduling, L = the multiprogramming level): level k is row k of the
  Ousterhout matrix; one row is active per time slice;
- ``shared`` (L workers of equal weight on one core, paper 001).

A job runs one process per core, all on the same level; its *width* is its number of processes
(``procs`` for a rigid job). The one exception: a task bag on a ``shared`` cluster may hold worker
slots on several levels (``slot_levels``, parallel to ``cores``, on ``Start``/``Resize``/``RunningJob``:
slot i is level ``slot_levels[i]`` of ``cores[i]``, and a core may appear once per level it holds;
paper 001's workers are VM instances, any of which a job may hold). Besides the per-core levels,
vcsched places capped *shared VMs* on whole nodes (``PlaceShared``); they hold no level of a core and
count against the node's CPU and memory.
What each action does to this occupancy is written once, in :mod:`vmctl.occupancy`.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, TypeAlias

from vmctl.errors import ValidationError
from vmctl.speedup import Speedup, times_from_model

#: a node's speed relative to a standard core, and its group (cluster or partition), when not configured
DEFAULT_NODE_SPEED = 1.0
DEFAULT_NODE_GROUP = "default"

MAX_NODE_SPEED = 1000.0
MAX_GROUP_NAME = 64


def group_name_problem(group: str) -> str | None:
    """Why ``group`` cannot name a node group, or None: a short printable name of letters, digits,
    '-', '_' and '.' (it is shown in tables and used as a key)."""
    if not group:
        return "must not be empty"
    if len(group) > MAX_GROUP_NAME:
        return f"longer than {MAX_GROUP_NAME} characters"
    bad = next((c for c in group if not (c.isalnum() or c in "-_.")), None)
    if bad is not None:
        return f"must hold only letters, digits, '-', '_' and '.', but holds {bad!a}"
    return None


# --------------------------------------------------------------------------------------- jobs


class Tier(StrEnum):
    FG = "fg"
    BG = "bg"

    def other(self) -> Tier:
        return Tier.BG if self is Tier.FG else Tier.FG


class Discipline(StrEnum):
    """How the L levels of a core share it (see the module docstring)."""

    PRIORITY = "priority"
    TIMESLICE = "timeslice"
    SHARED = "shared"


def tier_of_level(level: int) -> Tier:
    """The priority discipline's name of a level: 0 is fg, every lower level bg."""
    return Tier.FG if level == 0 else Tier.BG


#: paper 001 sec. II-B-3: a worker (one VM slot: a level of a core) is available (free, on a ready
#: node), occupied (held by a job whose process is not running there), busy (running a job's process)
#: or down (its node lost, or draining/drained and the slot free)
WORKER_STATES = ("available", "occupied", "busy", "down")


class JobState(StrEnum):
    QUEUED = "queued"  # waiting, never started or requeued after a kill
    RUNNING = "running"  # some processes placed (fg or bg)
    SUSPENDED = "suspended"  # gang scheduling: descheduled in this time slice / checkpointed
    DONE = "done"
    KILLED = "killed"  # killed at its estimate or by an operator
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Job:
    """What the scheduler knows about a job when it is submitted.

    ``estimate`` is the user's run-time estimate in seconds of dedicated-processor work; the job is
    killed when it has received that much work. ``cpu_usage`` holds the *estimated* CPU utilization
    (0 < u <= 1) of each process on a dedicated core, or is None when unknown (MEASY sec. 3.5.1).
    The actual run time and actual CPU usage are known only to the simulator or the real guest.
    """

    id: str
    submit_time: float
    procs: int
    estimate: float
    cpu_usage: tuple[float, ...] | None = None
    priority: int = 0
    deadline: float | None = None
    user: str = ""
    mem: float = 0.0  # memory need as a fraction of one host (vcsched); 0 = not modelled
    cpu_need: float = 1.0  # CPU need per task (one vCPU) as a fraction of one core (vcsched); 1 = a full core

    def __post_init__(self) -> None:
        if self.procs <= 0:
            raise ValidationError(field=f"job {self.id}.procs", problem=f"must be > 0, got {self.procs}")
        if not (self.estimate > 0 and math.isfinite(self.estimate)):
            raise ValidationError(
                field=f"job {self.id}.estimate", problem=f"must be a positive number, got {self.estimate}"
            )
        if self.cpu_usage is not None:
            if len(self.cpu_usage) != self.procs:
                raise ValidationError(
                    field=f"job {self.id}.cpu_usage",
                    problem=f"has {len(self.cpu_usage)} entries for {self.procs} processes",
                )
            for u in self.cpu_usage:
                if not 0.0 < u <= 1.0:
                    raise ValidationError(field=f"job {self.id}.cpu_usage", problem=f"{u} not in (0, 1]")

    def usage_of(self, process: int) -> float:
        """Estimated CPU utilization of one process; unknown counts as 1.0 (the safe assumption)."""
        return 1.0 if self.cpu_usage is None else self.cpu_usage[process]


#: the most widths a moldable shape may list, and the most tasks a task bag may hold
MAX_SHAPE_WIDTHS = 4096
MAX_SHAPE_TASKS = 1_000_000
#: the widest width, and the longest time or task work (seconds), a shape may name
MAX_SHAPE_WIDTH = 1_000_000
MAX_SHAPE_SECONDS = 1e10


@dataclass(frozen=True, slots=True)
class JobShape:
    """How wide a job may run, when it is not rigid (a rigid job runs exactly ``procs`` processes),
    and how long it runs at each width.

    - ``moldable`` (HSRET paper sec. 3.1): the policy picks the width when it starts the job, one of
      ``widths`` (increasing), and cannot change it later (``Start`` with that many cores).
      ``times[i]`` is the execution time in seconds at ``widths[i]`` on standard resources (speed
      1.0): a measured table, or derived from a speedup model (``speedup``, :mod:`vmctl.speedup`) and
      the time at the smallest width. Build one with :meth:`moldable` or :meth:`moldable_model`.
    - ``task-bag`` (paper 001 sec. II-A): independent tasks, ``tasks[i]`` seconds of work on a standard
      core each; the policy sets how many workers the job holds (1 .. ``max_workers``, which is
      ``widths[0]``) when it starts it and may change it at task boundaries (``Resize``). Build one
      with :meth:`task_bag`. ``task_usage`` (in (0, 1], default 1.0: CPU-bound) is the CPU usage of
      each of its tasks on a core of its own: a task demands that much of its core and progresses at
      its allocation over it (:mod:`vmctl.cpushare`, shared by the mock backend and the simulator); a
      task that sleeps for its length (paper 001's testbed) has a usage near 0 and runs at full speed
      beside another one on the same core.

    The shape lives beside the job, not in it (``Job`` stays the rigid job's record): the view carries
    shapes in ``ClusterView.shapes`` (job id -> shape; absent = rigid). Errors name the field
    (``shape.widths``, ``shape.times[2]``, ``shape.tasks[0]`` ...)."""

    kind: Literal["moldable", "task-bag"]
    widths: tuple[int, ...]
    times: tuple[float, ...] = ()
    tasks: tuple[float, ...] = ()
    speedup: Speedup | None = None
    task_usage: float = 1.0

    def __post_init__(self) -> None:
        widths = self.widths
        if self.kind not in ("moldable", "task-bag"):
            raise ValidationError(field="shape.kind", problem=f"must be moldable or task-bag, got {self.kind!r}")
        if self.kind == "task-bag" and not self.tasks:
            raise ValidationError(field="shape.tasks", problem="a task bag needs at least one task")
        if not widths or any(isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_SHAPE_WIDTH
                             for w in widths):
            raise ValidationError(field="shape.widths",
                                  problem=f"must list widths in [1, {MAX_SHAPE_WIDTH}], got {widths}")
        if self.kind == "moldable":
            self._check_moldable()
        else:
            self._check_task_bag()

    def _check_moldable(self) -> None:
        widths, times = self.widths, self.times
        if len(widths) > MAX_SHAPE_WIDTHS:
            raise ValidationError(field="shape.widths", problem=f"at most {MAX_SHAPE_WIDTHS} widths, got {len(widths)}")
        if any(b <= a for a, b in itertools.pairwise(widths)):
            raise ValidationError(field="shape.widths", problem=f"must be strictly increasing, got {widths}")
        if len(times) != len(widths):
            raise ValidationError(field="shape.times",
                                  problem=f"has {len(times)} times for {len(widths)} widths (one per width)")
        for i, t in enumerate(times):
            if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= MAX_SHAPE_SECONDS:
                raise ValidationError(field=f"shape.times[{i}]", problem=f"the time at width {widths[i]} must be a "
                                      f"positive number of seconds (at most {MAX_SHAPE_SECONDS:g}), got {t!r}")
        if self.tasks:
            raise ValidationError(field="shape.tasks", problem="a moldable job has no tasks (that is a task bag)")
        if self.task_usage != 1.0:
            raise ValidationError(field="shape.task_usage", problem="a moldable job has no tasks (that is a task bag)")

    def _check_task_bag(self) -> None:
        tasks = self.tasks
        if len(self.widths) != 1:
            raise ValidationError(field="shape.widths",
                                  problem=f"a task bag has one width, its max_workers; got {self.widths}")
        if not tasks:
            raise ValidationError(field="shape.tasks", problem="a task bag needs at least one task")
        if len(tasks) > MAX_SHAPE_TASKS:
            raise ValidationError(field="shape.tasks", problem=f"at most {MAX_SHAPE_TASKS} tasks, got {len(tasks)}")
        for i, w in enumerate(tasks):
            if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w <= MAX_SHAPE_SECONDS:
                raise ValidationError(field=f"shape.tasks[{i}]", problem=f"the work of a task must be a number of "
                                      f"seconds in [0, {MAX_SHAPE_SECONDS:g}], got {w!r}")
        if self.widths[0] > len(tasks):
            raise ValidationError(field="shape.max_workers",
                                  problem=f"{self.widths[0]} workers for {len(tasks)} tasks (at most one per task)")
        if self.times or self.speedup is not None:
            raise ValidationError(field="shape.times", problem="a task bag has per-task work, not times per width")
        u = self.task_usage
        if isinstance(u, bool) or not isinstance(u, int | float) or not 0 < u <= 1:
            raise ValidationError(field="shape.task_usage",
                                  problem=f"the CPU usage of a task must be in (0, 1], got {u!r}")

    # ------------------------------------------------------------------ constructors

    @classmethod
    def moldable(cls, table: Mapping[int, float]) -> JobShape:
        """A moldable shape from a measured table width -> execution time on standard resources."""
        if not table:
            raise ValidationError(field="shape.table", problem="must give at least one width -> time")
        widths = tuple(sorted(table))
        return cls("moldable", widths, tuple(table[w] for w in widths))

    @classmethod
    def moldable_model(cls, widths: Sequence[int], speedup: Speedup, time_at_min: float) -> JobShape:
        """A moldable shape whose times follow ``speedup`` (:mod:`vmctl.speedup`), taking
        ``time_at_min`` seconds at the smallest width."""
        ws = tuple(sorted(widths))
        if not ws or ws[0] < 1:
            raise ValidationError(field="shape.widths", problem=f"must list widths >= 1, got {tuple(widths)}")
        return cls("moldable", ws, times_from_model(speedup, ws, time_at_min), speedup=speedup)

    @classmethod
    def task_bag(cls, tasks: Sequence[float], max_workers: int | None = None, task_usage: float = 1.0) -> JobShape:
        """A task bag of ``tasks`` (work in seconds on a standard core each), holding at most
        ``max_workers`` workers (default: one per task), each task using ``task_usage`` of its core."""
        return cls("task-bag", (len(tasks) if max_workers is None else max_workers,), tasks=tuple(tasks),
                   task_usage=task_usage)

    # ------------------------------------------------------------------ queries

    @property
    def min_width(self) -> int:
        return 1 if self.kind == "task-bag" else self.widths[0]

    @property
    def max_width(self) -> int:
        return self.widths[-1]

    @property
    def max_workers(self) -> int:
        """A task bag's most workers (a moldable job's largest width)."""
        return self.widths[-1]

    def allows(self, width: int) -> bool:
        if self.kind == "task-bag":
            return 1 <= width <= self.widths[0]
        return width in self.widths

    def time_at(self, width: int) -> float:
        """How long the job runs at ``width`` on standard resources (speed 1.0): a moldable job's time
        at that width; a task bag's makespan on ``width`` workers that each take the next task in
        order when they finish one (greedy list scheduling, what the simulator's task-bag model does
        at a fixed width)."""
        if not self.allows(width):
            raise ValidationError(field="width", problem=f"{width} is not a width the job's shape allows "
                                                         f"({self.min_width}..{self.max_width})")
        if self.kind == "moldable":
            return self.times[self.widths.index(width)]
        free = [0.0] * width  # when each worker finishes its current task (a heap)
        for work in self.tasks:
            heapq.heapreplace(free, free[0] + work)
        return max(free)

    @property
    def work(self) -> float:
        """A task bag's total work (seconds on a standard core)."""
        return math.fsum(self.tasks)


def slots_of(cores: Sequence[int], level: int, slot_levels: Sequence[int] | None) -> tuple[tuple[int, int], ...]:
    """The (core, level) slots of a placement: ``level`` on every core, or ``slot_levels[i]`` on ``cores[i]``
    (a task bag on several levels of a ``shared`` cluster). Lengths must agree (the occupancy model checks)."""
    if slot_levels is None:
        return tuple((c, level) for c in cores)
    return tuple(zip(cores, slot_levels, strict=False))


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds VM slots. ``cores[i]`` carries process ``i``, on ``level`` of that core.

    ``level`` is the job's level on its cores (0 = fg, 1 = bg under the priority discipline);
    left at -1 it follows ``tier``, and ``tier`` stays the priority discipline's name of the level
    (a level >= 1 reads as bg). ``width`` is the number of processes it runs (``len(cores)``).
    vcsched's capped shared VMs hold no level: ``shared_nodes[i]`` is the node of process ``i`` and
    ``cap`` its CPU cap (fraction of one node; None = uncapped); their ``cores`` are stand-ins.

    ``progress`` is the dedicated-processor work (seconds) the job has received in its current run as
    of the view's time (reset to 0 by a kill; kept by promote, migrate and checkpoint/restore).
    ``expected_end`` is when the job ends at the latest if it keeps its tier and runs at full speed:
    ``now + estimate - progress`` for fg jobs; ``math.inf`` for bg jobs (their pace is not known).

    ``tasks_left``: a task bag's unfinished tasks (running or not started; paper 001's decision maker
    needs them), None for other jobs or where not known (an additive field: the simulator's task-bag
    model fills it, vmctld from its dispatcher's records).
    ``throughput``: a task bag's observed throughput per slot it holds, keyed ``(core, level)`` (work
    seconds per second on that slot's worker, corrected from the durations of the tasks that ended
    there: paper 001's status checker); vmctld fills it, None where nothing was observed (the policy
    then uses the node's speed).
    ``replicas`` (``timeslice`` discipline, gang scheduling's expansion): the other levels the job is
    replicated into, on the *same* cores (:class:`Replicate`); it advances in every slice where one of
    its rows (``level`` or a replica) is active. ``migrated_at``: when the job last moved to other
    cores (a ``Move``/``Migrate`` that changed its cores; ``-inf``: never), which lets a stateless
    policy count the tasks migrated in the current time slice (the gang policies' quota Q).
    ``slot_levels`` (task bags on a ``shared`` cluster only): the level of each of ``cores``, when the
    bag holds slots on several levels (a core may then appear once per level); None for every other
    job, which holds ``level`` of all its cores. ``level`` is then its lowest level (``tier`` its name);
    :attr:`slots` lists the (core, level) pairs either way.
    ``checkpointed``: the job was checkpointed (its state saved, its slots freed); it holds no slot,
    advances nothing and reads as ``suspended`` too (so readers that only ask whether a job advances
    need not know the difference), but only a ``Restore``/``Move`` onto cores brings it back: a
    ``Resume`` is for a suspended job, which keeps its slots.
    """

    job: Job
    tier: Tier
    cores: tuple[int, ...]
    start_time: float  # first start of the current run
    tier_since: float  # when it entered its current tier / placement
    progress: float = 0.0
    expected_end: float = math.inf
    suspended: bool = False
    level: int = -1
    cap: float | None = None
    shared_nodes: tuple[str, ...] = ()
    tasks_left: int | None = None
    replicas: tuple[int, ...] = ()
    migrated_at: float = -math.inf
    throughput: Mapping[tuple[int, int], float] | None = None
    checkpointed: bool = False
    slot_levels: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.slot_levels is not None and self.level < 0 and self.slot_levels:
            object.__setattr__(self, "level", min(self.slot_levels))
        if self.level < 0:
            object.__setattr__(self, "level", 0 if self.tier is Tier.FG else 1)
        elif (self.level == 0) != (self.tier is Tier.FG):
            raise ValidationError(
                field=f"running job {self.job.id}.tier",
                problem=f"{self.tier.value} does not name level {self.level} (fg is level 0)",
            )

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def width(self) -> int:
        return len(self.cores)

    @property
    def slots(self) -> tuple[tuple[int, int], ...]:
        """The (core, level) slots the job holds, in process order."""
        return slots_of(self.cores, self.level, self.slot_levels)

    @property
    def remaining_estimate(self) -> float:
        return max(0.0, self.job.estimate - self.progress)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Everything a policy may look at. Read-only by contract; the simulator passes live views of its
    own structures (no copies), so a policy must never keep references to them after ``decide``.

    - ``queue``: waiting jobs in queue order (submit time, then id). Jobs running in the bg tier are
      *not* in the queue; they are in ``running`` with ``tier == Tier.BG``.
    - ``fg_job[c]`` / ``bg_job[c]``: id of the job whose process occupies core c's fg / bg slot.
    - ``idle_fg`` / ``idle_bg``: usable cores whose fg / bg slot is free (maintained incrementally).
    - ``fg_util[c]``: measured (daemon) or modelled (simulator) CPU utilization of core c's fg VM,
      0..1; 0 when the fg slot is idle. A bg VM takes a process only while this is under the
      threshold (0.96 in the paper).
    - ``usable[c]``: False for cores of drained, lost or excluded nodes.
    - ``shapes``: job id -> ``JobShape`` of the moldable and task-bag jobs (absent = rigid).
    - ``levels`` / ``discipline``: the number L of VM levels per core and how they share it (see the
      module docstring); ``slot_job[level][core]`` and ``idle[level]`` give the occupancy of every
      level. ``fg_job``/``idle_fg`` are level 0 and ``bg_job``/``idle_bg`` level 1 (for L = 1,
      ``bg_job`` is all None and ``idle_bg`` empty); levels 2 .. L-1 are ``upper_job`` /
      ``upper_idle``. Build a view of any L with :meth:`ClusterView.leveled`.
    - ``queue_index``: optional ``job id -> Job`` map of exactly the jobs in ``queue``. A caller that
      maintains one anyway (the simulator, vmctld's cluster state) passes it so that the invariant
      checker finds the jobs a decision names in O(1) instead of scanning the queue; None means
      "scan ``queue``".
    """

    total_cores: int
    queue: Sequence[Job]
    running: Mapping[str, RunningJob]
    fg_job: Sequence[str | None]
    bg_job: Sequence[str | None]
    idle_fg: Set[int]
    idle_bg: Set[int]
    fg_util: Sequence[float]
    usable: Sequence[bool]
    node_of_core: Sequence[str] = ()
    local_core: Sequence[int] = ()
    # vcsched: a node's CPU capacity is its cores here (``node_of_core``); memory is a fraction of the node.
    node_names: Sequence[str] = ()
    queue_index: Mapping[str, Job] | None = None
    # vmctld: node -> the nodes it can live-migrate to (its agent's ``peers``); a node not in the map,
    # or None for the whole map (the simulator), is not restricted. Use ``can_migrate``.
    migration_targets: Mapping[str, Set[str]] | None = None
    # node -> its speed relative to a standard core, its group (cluster or partition) and its memory in
    # MiB, keyed by the names of ``node_names``; a node not in a map has the default (use ``speed_of``,
    # ``group_of`` and ``mem_mib_of``). The simulator, which has no nodes, leaves them empty.
    node_speed: Mapping[str, float] = field(default_factory=dict)
    node_group: Mapping[str, str] = field(default_factory=dict)
    node_mem_mib: Mapping[str, int] = field(default_factory=dict)
    levels: int = 2
    discipline: Discipline = Discipline.PRIORITY
    upper_job: Sequence[Sequence[str | None]] = ()
    upper_idle: Sequence[Set[int]] = ()
    # job id -> shape of the jobs that are not rigid (moldable, task bags); absent = rigid
    shapes: Mapping[str, JobShape] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.levels < 1:
            raise ValidationError(field="view.levels", problem=f"must be >= 1, got {self.levels}")
        if self.discipline is Discipline.PRIORITY and self.levels != 2:
            raise ValidationError(
                field="view.levels", problem=f"the priority discipline has 2 levels, not {self.levels}"
            )
        upper = max(0, self.levels - 2)
        if len(self.upper_job) != upper or len(self.upper_idle) != upper:
            raise ValidationError(
                field="view.upper_job",
                problem=f"{self.levels} levels need {upper} upper levels, got {len(self.upper_job)} "
                f"occupancies and {len(self.upper_idle)} idle sets",
            )

    @classmethod
    def leveled(
        cls,
        total_cores: int,
        queue: Sequence[Job],
        running: Mapping[str, RunningJob],
        slot_job: Sequence[Sequence[str | None]],
        idle: Sequence[Set[int]],
        discipline: Discipline,
        fg_util: Sequence[float],
        usable: Sequence[bool],
        **rest: Any,
    ) -> ClusterView:
        """A view of ``len(slot_job)`` levels: ``slot_job[level][core]`` and ``idle[level]``; ``rest``
        are the other fields (``node_of_core``, ``queue_index`` ...)."""
        levels = len(slot_job)
        if levels < 1 or len(idle) != levels:
            raise ValidationError(field="view.slot_job", problem=f"{levels} levels with {len(idle)} idle sets")
        none: Sequence[str | None] = [None] * total_cores
        return cls(
            total_cores=total_cores, queue=queue, running=running, fg_job=slot_job[0],
            bg_job=slot_job[1] if levels > 1 else none, idle_fg=idle[0],
            idle_bg=idle[1] if levels > 1 else frozenset(), fg_util=fg_util, usable=usable, levels=levels,
            discipline=discipline, upper_job=tuple(slot_job[2:]), upper_idle=tuple(idle[2:]), **rest,
        )

    @property
    def slot_job(self) -> tuple[Sequence[str | None], ...]:
        """``slot_job[level][core]``: the job on that level of that core, or None."""
        return (self.fg_job, self.bg_job, *self.upper_job)[: self.levels]

    @property
    def idle(self) -> tuple[Set[int], ...]:
        """``idle[level]``: the usable cores whose slot on that level is free."""
        return (self.idle_fg, self.idle_bg, *self.upper_idle)[: self.levels]

    def node(self, core: int) -> str:
        return self.node_of_core[core] if self.node_of_core else "sim"

    def speed_of(self, node: str) -> float:
        """How fast one core of ``node`` runs relative to a standard core (1.0 when not known)."""
        return self.node_speed.get(node, DEFAULT_NODE_SPEED)

    def group_of(self, node: str) -> str:
        """The cluster or partition ``node`` belongs to (``"default"`` when not known)."""
        return self.node_group.get(node, DEFAULT_NODE_GROUP)

    def mem_mib_of(self, node: str) -> int:
        """The memory of ``node`` in MiB (0 when not known)."""
        return self.node_mem_mib.get(node, 0)

    def can_migrate(self, source: str, target: str) -> bool:
        """Whether a process may move from node ``source`` to node ``target`` (always within a node)."""
        targets = self.migration_targets
        if targets is None or source == target:
            return True
        allowed = targets.get(source)
        return allowed is None or target in allowed


# --------------------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True, init=False)
class StartFg:
    """Start (or restart from scratch) a queued job: process i on the fg slot of cores[i]."""

    job_id: str
    cores: tuple[int, ...]
    kind: Literal["start_fg"] = "start_fg"

    def __init__(self, job_id: str, cores: tuple[int, ...], kind: Literal["start_fg"] = "start_fg") -> None:
        _SET_START_FG[0](self, job_id)  # see _slot_setters: the hot path of every simulation
        _SET_START_FG[1](self, cores)
        _SET_START_FG[2](self, kind)


@dataclass(frozen=True, slots=True, init=False)
class StartBg:
    """Start a queued job in the bg tier: process i on the bg slot of cores[i]."""

    job_id: str
    cores: tuple[int, ...]
    kind: Literal["start_bg"] = "start_bg"

    def __init__(self, job_id: str, cores: tuple[int, ...], kind: Literal["start_bg"] = "start_bg") -> None:
        _SET_START_BG[0](self, job_id)
        _SET_START_BG[1](self, cores)
        _SET_START_BG[2](self, kind)


@dataclass(frozen=True, slots=True)
class Promote:
    """Swap fg/bg CPU priority on the job's own cores: the bg job becomes fg in place, without a
    restart. Legal only when every one of its cores has an idle fg slot (MEASY Algorithm 2 line 5)."""

    job_id: str
    kind: Literal["promote"] = "promote"


@dataclass(frozen=True, slots=True)
class Demote:
    """The reverse of Promote (operator action or gang scheduling)."""

    job_id: str
    kind: Literal["demote"] = "demote"


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move a running job (keeping its progress) to other cores and tier; costs ``cost`` seconds of
    no progress (checkpoint/restart or live migration)."""

    job_id: str
    cores: tuple[int, ...]
    tier: Tier = Tier.FG
    cost: float = 0.0
    kind: Literal["migrate"] = "migrate"


@dataclass(frozen=True, slots=True)
class Kill:
    """Kill a running job. With ``requeue`` it goes back to the queue and loses its progress
    (KEASY: kill, then Dispatch to fg in the same decision)."""

    job_id: str
    requeue: bool = True
    reason: str = ""
    kind: Literal["kill"] = "kill"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Save a running job's VMs to disk and free its slots; the job keeps its progress."""

    job_id: str
    kind: Literal["checkpoint"] = "checkpoint"


@dataclass(frozen=True, slots=True)
class Restore:
    """Restore a checkpointed job onto cores in a tier."""

    job_id: str
    cores: tuple[int, ...]
    tier: Tier = Tier.FG
    kind: Literal["restore"] = "restore"


@dataclass(frozen=True, slots=True)
class SetCap:
    """Set the CPU cap of a job's VMs: a fraction of one core in (0, 1], None = uncapped."""

    job_id: str
    cap: float | None
    kind: Literal["set_cap"] = "set_cap"


@dataclass(frozen=True, slots=True)
class Suspend:
    """Gang scheduling: deschedule a running job for this time slice (slots stay reserved)."""

    job_id: str
    kind: Literal["suspend"] = "suspend"


@dataclass(frozen=True, slots=True)
class Resume:
    job_id: str
    kind: Literal["resume"] = "resume"


@dataclass(frozen=True, slots=True)
class PlaceShared:
    """vcsched: run the job's processes as capped shared VMs (``vmctl.nodedoc.VmRole.SHARED``), process i on node
    ``nodes[i]`` (a node may hold several), each capped at ``cap`` of one core (a VM is one vCPU: cap
    <= 1; a node's caps sum to at most its cores). Starts a queued job, or re-places a running one
    (processes whose node changes are migrated)."""

    job_id: str
    nodes: tuple[str, ...]
    cap: float
    kind: Literal["place_shared"] = "place_shared"


@dataclass(frozen=True, slots=True)
class Start:
    """Start a queued job on ``level`` of ``cores``: process i on cores[i]. Its width is
    ``len(cores)``, which must equal ``job.procs`` for a rigid job. ``StartFg``/``StartBg`` are the
    priority discipline's names of a start on level 0 / 1 (kept as their own classes: the simulator's
    hot path). ``reason``: why this width and these cores (optional; vmctld stores it with the job and
    ``vmctl job show`` prints it: the moldable policy says which width it chose and why).
    ``slot_levels`` (task bags on a ``shared`` cluster only; None: ``level`` for every core): worker i
    on level ``slot_levels[i]`` of ``cores[i]`` (see the module docstring); ``level`` is then ignored."""

    job_id: str
    cores: tuple[int, ...]
    level: int = 0
    kind: Literal["start"] = "start"
    reason: str = ""
    slot_levels: tuple[int, ...] | None = None

    @property
    def width(self) -> int:
        return len(self.cores)

    @property
    def slots(self) -> tuple[tuple[int, int], ...]:
        return slots_of(self.cores, self.level, self.slot_levels)


@dataclass(frozen=True, slots=True)
class Move:
    """Move a running job, keeping its progress, to ``level`` of ``cores`` (None = its own cores);
    ``cost`` seconds of no progress. One action for what the priority discipline calls promote
    (level 1 -> 0 in place), demote (0 -> 1 in place) and migrate (other cores), and for a restore of
    a checkpointed job. Keeps its width."""

    job_id: str
    cores: tuple[int, ...] | None = None
    level: int = 0
    cost: float = 0.0
    kind: Literal["move"] = "move"


@dataclass(frozen=True, slots=True)
class Resize:
    """Task bags: the job's workers run on ``level`` of ``cores`` from now on (the width is
    ``len(cores)``), or, with ``slot_levels`` (a ``shared`` cluster), worker i on level
    ``slot_levels[i]`` of ``cores[i]``. Applied at task boundaries: a running task is never killed to
    shrink a job (a given-up slot whose worker runs a task stays the job's until that task ends)."""

    job_id: str
    cores: tuple[int, ...]
    level: int = 0
    kind: Literal["resize"] = "resize"
    slot_levels: tuple[int, ...] | None = None

    @property
    def slots(self) -> tuple[tuple[int, int], ...]:
        return slots_of(self.cores, self.level, self.slot_levels)


@dataclass(frozen=True, slots=True)
class Replicate:
    """Time slicing (gang scheduling's expansion, paper 004 sec. 2): a running job also runs on
    ``level`` of its *own* cores (they must be free there); it then advances in every slice where any
    of its rows is active. Kill, completion and checkpoint free every row; a replicated job cannot
    Move or Resize (unreplicate it first)."""

    job_id: str
    level: int
    kind: Literal["replicate"] = "replicate"


@dataclass(frozen=True, slots=True)
class Unreplicate:
    """Drop one row (``level``) of a job that runs in several; when it is the job's ``level``, its
    lowest remaining replica becomes its level. A job's last row is left with Kill/Checkpoint."""

    job_id: str
    level: int
    kind: Literal["unreplicate"] = "unreplicate"


@dataclass(frozen=True, slots=True)
class SliceSchedule:
    """Time slicing (``timeslice`` discipline): row (level) ``order[k]`` is active during the k-th
    ``period`` seconds of each cycle, starting at ``epoch``. Agents switch rows on their own clock: no
    decision per slice."""

    period: float
    order: tuple[int, ...]
    epoch: float = 0.0

    def slot(self, t: float) -> int:
        """The index of the slice in progress at ``t`` (0 before ``epoch``)."""
        return max(0, math.floor((t - self.epoch) / self.period))

    def active_row(self, t: float) -> int:
        """The row whose VMs run at ``t``: ``order[slot(t) % len(order)]``. Example: period 200, order
        (0, 2), epoch 1000: row 0 runs 1000-1200 (and before), row 2 1200-1400, row 0 1400-1600; row 1
        (empty) never runs."""
        return self.order[self.slot(t) % len(self.order)]

    def next_switch(self, t: float) -> float:
        """The time of the first row switch after ``t``."""
        return self.epoch + (self.slot(t) + 1) * self.period


Action: TypeAlias = (
    StartFg | StartBg | Promote | Demote | Migrate | Kill | Checkpoint | Restore | SetCap | Suspend | Resume
    | PlaceShared | Start | Move | Resize | Replicate | Unreplicate
)


@dataclass(frozen=True, slots=True)
class Reservation:
    """An EASY-style reservation a policy made for the head of the queue (reported by the daemon's
    ``explain``): the job starts at ``shadow_time`` at the latest; ``extra_cores`` may be backfilled."""

    job_id: str
    shadow_time: float
    extra_cores: int = 0


@dataclass(frozen=True, slots=True, init=False)
class Decision:
    """What a policy decided at one event. Actions apply in order (a Kill may be followed by a StartFg
    of the same job). Every queued job that is not started is waiting for ``reasons[job_id]`` or,
    when absent, for ``default_reason``. ``wake_at`` asks for another pass at that time (for example
    a reservation's shadow time) even if no event happens."""

    actions: tuple[Action, ...] = ()
    wake_at: float | None = None
    reasons: Mapping[str, str] = field(default_factory=dict)
    default_reason: str = "waiting for free cores"
    reservation: Reservation | None = None  # optional: the head job's reservation, when the policy has one
    schedule: SliceSchedule | None = None  # timeslice discipline: the row rotation from now on

    def __init__(
        self, actions: tuple[Action, ...] = (), wake_at: float | None = None, reasons: Mapping[str, str] | None = None,
        default_reason: str = "waiting for free cores", reservation: Reservation | None = None,
        schedule: SliceSchedule | None = None,
    ) -> None:
        """The dataclass fields, in order; ``reasons`` None (the default) is a new empty dict."""
        s_actions, s_wake, s_reasons, s_default, s_reservation, s_schedule = _SET_DECISION
        s_actions(self, actions)
        s_wake(self, wake_at)
        s_reasons(self, {} if reasons is None else reasons)
        s_default(self, default_reason)
        s_reservation(self, reservation)
        s_schedule(self, schedule)

    def reason_for(self, job_id: str) -> str:
        return self.reasons.get(job_id, self.default_reason)


def _slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[Any, Any], None], ...]:
    """The slot descriptors' setters of a frozen slotted dataclass, for a hand-written ``__init__``.

    ``StartFg``, ``StartBg`` and ``Decision`` are built once per job or per scheduling pass in a
    simulation; the dataclass ``__init__`` of a frozen class routes every field through
    ``object.__setattr__``, which costs about twice as much as setting the slot directly. The classes
    stay frozen (assignment still raises ``FrozenInstanceError``), with the same fields, defaults,
    equality, hash and repr. Guarded: the names must be the class's fields, in order."""
    fields = tuple(f.name for f in dataclasses.fields(cls))
    if fields != names:  # pragma: no cover - a tripwire for whoever changes these classes
        raise RuntimeError(f"vmctl.model: {cls.__name__} has fields {fields}, its __init__ sets {names}")
    return tuple(cls.__dict__[name].__set__ for name in names)


_SET_START_FG = _slot_setters(StartFg, ("job_id", "cores", "kind"))
_SET_START_BG = _slot_setters(StartBg, ("job_id", "cores", "kind"))
_SET_DECISION = _slot_setters(Decision, ("actions", "wake_at", "reasons", "default_reason", "reservation", "schedule"))


# --------------------------------------------------------------------- a host's layout of levels


#: most VM levels per core an agent carries (``vmctl.agents.layout.MAX_LEVELS``): gang scheduling's
#: multiprogramming levels are small, and every level is a VM on every core
MAX_LAYOUT_LEVELS = 8


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """A host's VM level layout: ``levels`` VMs per core under one ``discipline`` (docs/agent.md). vmctld
    puts the layout the policy in force needs into every node's desired state (``NodeDesired.layout``); an
    agent reports the one it has (``NodeObserved.layout``)."""

    discipline: Discipline
    levels: int

    def __post_init__(self) -> None:
        if isinstance(self.levels, bool) or not 1 <= self.levels <= MAX_LAYOUT_LEVELS:
            raise ValidationError(field="layout.levels",
                                  problem=f"must be 1..{MAX_LAYOUT_LEVELS} VM levels per core, got {self.levels!r}")

    def text(self) -> str:
        """``3 timeslice levels per core``."""
        return f"{self.levels} {self.discipline.value} level{'s' if self.levels != 1 else ''} per core"
