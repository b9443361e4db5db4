"""The moldable task model with slot time (HSRET paper, "paper 002", sec. 3.1-3.2 and 4.2), shared by
HSRET, AFCFS, ALL-EFT and CBSP (``vmctl.policies.moldable``) and the slot-stepped simulator
(``vmctl.sim.moldable``).

Eq. (1): a task is ``{ar_i, dl_i, <pl_i^j, et_i^j, sp_i^j>, minp_i, maxp_i}``: arrival, deadline and,
for each allowed parallelism (width) ``pl^j`` between ``minp`` and ``maxp``, the execution time
``et^j`` on standard resources (speed 1.0). Here a task is its arrival, deadline, ``length`` (minutes at
its smallest width on standard resources) and a :class:`Profile`: the widths and the time at each width
relative to the smallest (``rel[0] == 1``), so ``et^j = length * rel[j]``. Tasks of one application
share a profile (the paper's WRF and GRAPES tasks, sec. 6.1), which is what makes the normalized
execution time of eq. (7) a property of the profile, not of the task.

Clusters (sec. 6.1): a task runs inside one cluster; every node of cluster ``c`` has speed
``speed[c]`` (the paper draws it from [0.8, 1.2]), so width ``w`` on cluster ``c`` takes
``length * rel[w] / speed[c]`` minutes.

Slot time (sec. 3.2): time is cut into slots of ``SL`` minutes. Decisions happen at slot boundaries.
A started task keeps its width and cluster; in each slot it either runs on ``w`` nodes of its cluster
for the whole slot or is suspended (all its sub-tasks of that slot wait; **reconstruction**: the
paper's Fig. 1-2 were lost; we run a task's ``w`` parallel sub-tasks of one slot together, as a gang,
because they exchange data, sec. 6.1). A task that needs ``n = ceil(time / SL)`` running slots ends at
the end of its n-th running slot: it holds its nodes "exclusively until the end of every slot time",
so the unused rest of the last slot is the "resource fragment" of sec. 6.2.1, and its completion
(for execution time and deadline) is that slot's end.

Tiny example: ``length`` 500 min, profile widths (4, 8) with ``rel`` (1, 0.55), cluster speed 1.1,
``SL`` 360: at width 4 the task needs ceil(500 / 1.1 / 360) = 2 slots, at width 8 ceil(250 / 360) = 1.
Started at slot 3 at width 8 it completes at 4 * 360 = 1440 min, so it meets a deadline of 1440.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from vmctl.errors import ValidationError

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from vmctl.model import JobShape

#: rounding guard for "does it fit in n slots" (minutes are floats)
EPS = 1e-9


def check_slot(slot: float) -> float:
    """The slot length SL in minutes; > 0 (field ``slot``)."""
    if isinstance(slot, bool) or not isinstance(slot, int | float) or not math.isfinite(slot) or slot <= 0:
        raise ValidationError(field="slot", problem=f"the slot length must be a number of minutes > 0, got {slot!r}")
    return float(slot)


@dataclass(frozen=True)
class Profile:
    """How one application's execution time falls with its width (sec. 3.1, eq. 1).

    ``widths`` strictly increasing, ``rel[j]`` the time at ``widths[j]`` over the time at
    ``widths[0]``. Times must not grow with the width (field ``shape.times[j]``): a width slower than a
    narrower one would never be chosen by any of the four methods, and eq. (7) needs the time to fall
    monotonically for "the width of normalized time x" to be one width. ``net`` is eq. (7):
    ``(et^j - min et) / (max et - min et)``, 1 at the smallest width and 0 at the fastest (all 0 for a
    profile of one width or of equal times)."""

    name: str
    widths: tuple[int, ...]
    rel: tuple[float, ...]
    w: NDArray[np.int64] = field(init=False, repr=False, compare=False)
    r: NDArray[np.float64] = field(init=False, repr=False, compare=False)
    net: NDArray[np.float64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ws, rel = self.widths, self.rel
        if not ws:
            raise ValidationError(field="shape.widths", problem="must list at least one width")
        if any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in ws):
            raise ValidationError(field="shape.widths", problem=f"must be integers >= 1, got {ws}")
        for j in range(1, len(ws)):
            if ws[j] <= ws[j - 1]:
                raise ValidationError(field=f"shape.widths[{j}]", problem=f"must be strictly increasing, got {ws}")
        if len(rel) != len(ws):
            raise ValidationError(field="shape.times", problem=f"{len(rel)} times for {len(ws)} widths")
        for j, x in enumerate(rel):
            if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x <= 0:
                raise ValidationError(field=f"shape.times[{j}]", problem=f"must be a positive number, got {x!r}")
            if j and x > rel[j - 1] * (1 + 1e-12):
                raise ValidationError(
                    field=f"shape.times[{j}]",
                    problem=f"the time at width {ws[j]} ({x:g}) exceeds the time at width {ws[j - 1]} "
                            f"({rel[j - 1]:g}): times must not grow with the width (eq. 7 needs a monotone profile)")
        base = float(rel[0])
        r = np.array([x / base for x in rel], dtype=np.float64)
        span = r[0] - r[-1]
        net = (r - r[-1]) / span if span > 0 else np.zeros_like(r)
        object.__setattr__(self, "w", np.array(ws, dtype=np.int64))
        object.__setattr__(self, "r", r)
        object.__setattr__(self, "net", net)

    @classmethod
    def from_shape(cls, name: str, shape: JobShape) -> Profile:
        """A profile from a moldable :class:`vmctl.model.JobShape` (a measured table or a speedup model)."""
        if shape.kind != "moldable":
            raise ValidationError(field="shape.kind", problem=f"must be moldable, got {shape.kind!r}")
        return cls(name, tuple(shape.widths), tuple(float(t) for t in shape.times))

    @property
    def minp(self) -> int:
        return self.widths[0]

    @property
    def maxp(self) -> int:
        return self.widths[-1]

    def index(self, width: int) -> int:
        """The index of ``width``; a width that is not one of the profile's is an error (field ``width``)."""
        if width not in self.widths:
            raise ValidationError(field="width", problem=f"{width} is not an allowed width "
                                  f"(minp {self.minp}, maxp {self.maxp}: {list(self.widths)})")
        return self.widths.index(width)

    def index_for_net(self, snet: float) -> int:
        """The narrowest width whose normalized time is at most ``snet`` (Algorithm 1 line 7: "get the
        execution time according to the normalized execution time"); ``snet`` >= 1 gives ``minp``."""
        ok = np.nonzero(self.net <= snet + EPS)[0]
        return int(ok[0]) if ok.size else len(self.widths) - 1

    def minstep(self) -> float:
        """The smallest gap between the normalized times of two neighbouring widths (Algorithm 1 line 3):
        a finer step never changes any width."""
        gaps = -np.diff(self.net)
        gaps = gaps[gaps > EPS]
        return float(gaps.min()) if gaps.size else 1.0


@dataclass(frozen=True)
class Clusters:
    """``nodes[c]`` nodes of speed ``speed[c]`` (standard resource = 1.0) per cluster (node group)."""

    nodes: tuple[int, ...]
    speed: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValidationError(field="clusters", problem="need at least one cluster")
        if len(self.speed) != len(self.nodes):
            raise ValidationError(field="clusters.speed", problem=f"{len(self.speed)} speeds for {len(self.nodes)} "
                                  "clusters")
        for c, n in enumerate(self.nodes):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValidationError(field=f"clusters.nodes[{c}]", problem=f"must be an integer >= 1, got {n!r}")
        for c, s in enumerate(self.speed):
            if isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s) or s <= 0:
                raise ValidationError(field=f"clusters.speed[{c}]", problem=f"must be a number > 0, got {s!r}")

    @property
    def n(self) -> NDArray[np.int64]:
        return np.array(self.nodes, dtype=np.int64)

    @property
    def s(self) -> NDArray[np.float64]:
        return np.array(self.speed, dtype=np.float64)


def check_task(arrival: float, deadline: float, length: float, where: str = "task") -> None:
    """Bad task input: a deadline not after the arrival, a length not > 0 (fields named)."""
    for name, v in (("arrival", arrival), ("deadline", deadline), ("length", length)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValidationError(field=f"{where}.{name}", problem=f"must be a number, got {v!r}")
    if length <= 0:
        raise ValidationError(field=f"{where}.length", problem=f"must be > 0 minutes, got {length!r}")
    if deadline <= arrival:
        raise ValidationError(field=f"{where}.deadline",
                              problem=f"the deadline {deadline:g} is not after the arrival {arrival:g}")


@dataclass
class SlotView:
    """What a policy sees at the start of slot ``now`` (time ``now * slot`` minutes).

    Waiting tasks (arrived, not started; ``w_*``, in arrival order) and active tasks (started, not
    finished; ``a_*``). ``a_rem`` is the *forecast* number of running slots still needed (at least 1:
    a task that overran its forecast is expected to end in the next slot it runs). Lengths and times are
    forecasts; the simulator alone knows the actual times (forecast accuracy rho, sec. 6.1)."""

    now: int
    slot: float
    clusters: Clusters
    profiles: tuple[Profile, ...]
    w_id: NDArray[np.int64]
    w_arrival: NDArray[np.float64]
    w_deadline: NDArray[np.float64]
    w_length: NDArray[np.float64]
    w_profile: NDArray[np.int64]
    a_id: NDArray[np.int64]
    a_arrival: NDArray[np.float64]
    a_deadline: NDArray[np.float64]
    a_length: NDArray[np.float64]
    a_profile: NDArray[np.int64]
    a_cluster: NDArray[np.int64]
    a_width: NDArray[np.int64]
    a_rem: NDArray[np.int64]
    #: finished tasks whose deadline is after now (HSRET's load, eqs. 2-4, counts every task that
    #: "arrive[d] before the slot time now and ha[s] a deadline more than now")
    f_arrival: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    f_deadline: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    f_length: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    f_profile: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def t(self) -> float:
        return self.now * self.slot

    def slots_needed(self, length: float, profile: Profile) -> NDArray[np.int64]:
        """``n[c, j]``: running slots a task of ``length`` needs at width ``j`` on cluster ``c``."""
        minutes = length * profile.r[None, :] / self.clusters.s[:, None]
        return np.maximum(1, np.ceil(minutes / self.slot - EPS)).astype(np.int64)

    def meets(self, n: NDArray[np.int64], deadline: float, delay: int = 0) -> NDArray[np.bool_]:
        """Whether ``n`` running slots started ``delay`` slots from now end by ``deadline``."""
        return (self.now + delay + n) * self.slot <= deadline + EPS

    def free_nodes(self, running: NDArray[np.bool_]) -> NDArray[np.int64]:
        """Nodes of each cluster not held this slot by the active tasks marked ``running``."""
        held = np.bincount(self.a_cluster[running], weights=self.a_width[running],
                           minlength=len(self.clusters.nodes))
        return self.clusters.n - held.astype(np.int64)


@dataclass(frozen=True)
class Start:
    """Start waiting task ``task`` now at ``width`` on ``cluster`` (it runs this slot)."""

    task: int
    cluster: int
    width: int


@dataclass
class Decision:
    """A policy's answer for one slot: the tasks it starts, and which active tasks run this slot
    (``running[k]`` for ``view.a_id[k]``; the others are suspended for this slot)."""

    starts: list[Start]
    running: NDArray[np.bool_]
    #: what the policy wants reported about the slot (HSRET: its load case and normalized time)
    notes: dict[str, float] = field(default_factory=dict)


class MoldablePolicy(Protocol):
    name: str

    def decide(self, view: SlotView) -> Decision: ...


def monotone(p: Profile) -> bool:
    """Whether the profile's times never grow with the width (exactly; :class:`Profile` allows a growth
    of a rounding error): then a task's slot count never grows with the width either, so on each
    cluster the widths that meet a deadline are those from some index on (:func:`deadline_table`)."""
    return bool((np.diff(p.r) <= 0).all())


def deadline_table(view: SlotView, tasks: Sequence[int]) -> dict[int, tuple[NDArray[np.int64], list[int]]]:
    """For waiting tasks ``tasks`` (indexes into ``view.w_*``): ``n[c, j]`` (:meth:`SlotView.slots_needed`)
    and ``lo[c]``, the first width index whose ``n`` started now meets the deadline on cluster ``c``
    (:meth:`SlotView.meets`; the number of widths when none does), computed for all of them in one
    vectorized pass per profile with the same operations as one task at a time."""
    out: dict[int, tuple[NDArray[np.int64], list[int]]] = {}
    idx = np.asarray(tasks, dtype=np.int64)
    of = view.w_profile[idx]
    speed = view.clusters.s
    for pi, p in enumerate(view.profiles):
        m = idx[of == pi]
        if m.size == 0:
            continue
        minutes = view.w_length[m][:, None, None] * p.r[None, None, :] / speed[None, :, None]
        n = np.maximum(1, np.ceil(minutes / view.slot - EPS)).astype(np.int64)
        meets = (view.now + n) * view.slot <= view.w_deadline[m][:, None, None] + EPS
        lo = np.where(meets.any(axis=2), meets.argmax(axis=2), len(p.widths)).tolist()
        for k, i in enumerate(m.tolist()):
            out[i] = (n[k], lo[k])
    return out


def all_running(view: SlotView) -> NDArray[np.bool_]:
    """Every active task runs (the policies that never suspend: AFCFS, ALL-EFT, CBSP)."""
    return np.ones(len(view.a_id), dtype=np.bool_)


def hopeless(view: SlotView, i: int) -> bool:
    """Waiting task ``i`` cannot meet its deadline any more, whatever width and cluster it gets now."""
    p = view.profiles[int(view.w_profile[i])]
    n = view.slots_needed(float(view.w_length[i]), p)
    return not bool(view.meets(n, float(view.w_deadline[i])).any())
