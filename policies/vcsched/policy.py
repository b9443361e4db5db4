"""VCSCHED algorithms as scheduling policies (Casanova et al., RR-6692; registered as
``vcsched-<algorithm>``: ``vcsched-mcb8``, ``vcsched-milp``, ``vcsched-sg``, ... plus
``vcsched-dynamic`` (our MCB8-based re-packing under a migration budget, sec. 6) and
``vcsched-dyn-milp`` (the exact dynamic MILP).

On every call the policy builds one VCSCHED instance from the view: hosts are the usable nodes
(``view.node_names``, else the nodes of ``view.node_of_core``, else one host per usable core), and
every running job plus every submitted queued job is a (parallel) job of ``procs`` tasks, each
needing ``Job.cpu_need`` CPU (a fraction of one core) and ``Job.mem`` memory (a fraction of one node).
It solves the instance and emits, per job:

* ``PlaceShared(job, nodes, cap)`` for a queued job it admits, or for a running job whose set of
  nodes changes (the agents migrate the processes that move);
* ``SetCap(job, cap)`` for a running job that stays on the same nodes.

``cap`` is the CPU each of the job's tasks gets, a fraction of one core (equal within a job). Admission
(sec. 2.1: the resource allocator may reject or delay requests): running jobs are always kept; the
longest prefix of the queue (in queue order) is admitted for which the algorithm finds an allocation
with minimum yield >= ``min_yield`` (binary search on the prefix length); the others wait with a
reason. If not even the running jobs can be allocated, the decision changes nothing.

Multi-core nodes: how the paper's model reads on them. The paper (sec. 2.3) has ``H`` identical hosts
of CPU capability 1 and per-job needs ``alpha_i`` in [0, 1], fractions of one host, with the constraints
sum_i alpha_ij <= 1 per host and alpha_ij <= alpha_i per job. Our hosts are nodes of ``C`` cores and a
task is a VM of one vCPU, which can use at most one core: its need ``cpu_need`` and its cap are
fractions of *one core* (at most 1), and a node's CPU capacity is its ``C`` cores (caps on a node sum
to at most ``C``; one vCPU per VM and caps summing to at most ``C`` are always schedulable on ``C``
cores). That is the paper's problem with ``alpha_i = cpu_need / C``: its two constraints become
sum caps <= C and cap <= cpu_need (<= 1 core), so every algorithm runs unchanged on the instance in host
units and the caps it returns are multiplied back by ``C``. The yield (cap / need) is the same in both
units. The paper's hosts are identical; when the nodes' core counts differ, every host counts as the
smallest's ``C`` (its usable cores, :func:`host_cores`; the extra cores of larger nodes are left idle,
never overcommitted). ``mem`` stays a fraction of one node. On one-core nodes (the simulator's by
default, ``SimConfig.cores_per_node`` = 1; ``vmctl vcsched eval``'s instances, already in host units)
nothing changes.

Example: 2 one-core nodes, three queued 1-process jobs with cpu_need 0.6, mem 0: ``vcsched-mcb8`` places
two jobs on one node and one on the other, caps 0.5, 0.5 and 0.6 (minimum yield 0.833). On 2 nodes of 4
cores the three fit at their need (caps 0.6, yield 1); so do 4 VMs of need 0.4 on one 4-core node (caps
0.4 each, 1.6 of 4 cores), where a one-core reading would cap them at 0.25.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from vmctl.errors import PolicyParameterError
from vmctl.model import Action, ClusterView, Decision, Job, PlaceShared, SetCap
from vmctl.policies.base import Needs, SchedulingPolicy
from vmctl.policies.registry import register
from vmctl.policies.vcsched.algorithms import ALGORITHMS, solve
from vmctl.policies.vcsched.dynamic import dynamic_mcb, dynamic_milp
from vmctl.policies.vcsched.greedy import DEFAULT_MAX_ATTEMPTS
from vmctl.policies.vcsched.instance import Instance, Solution


def cluster_nodes(view: ClusterView) -> list[str]:
    """Usable nodes of the view, in order (the VCSCHED hosts)."""
    if view.node_of_core:
        usable: dict[str, bool] = {}
        for c, node in enumerate(view.node_of_core):
            usable[node] = usable.get(node, False) or bool(view.usable[c])
        names = list(view.node_names) or list(usable)
        return [n for n in names if usable.get(n, True)]
    if view.node_names:
        return list(view.node_names)
    return [f"core{c}" for c in range(view.total_cores) if view.usable[c]]


def host_cores(view: ClusterView, nodes: Sequence[str]) -> int:
    """The CPU capacity of every VCSCHED host, in cores: the fewest usable cores of ``nodes`` (the
    paper's hosts are identical; see the module docstring). 1 when the view has no cores per node."""
    if not view.node_of_core or not nodes:
        return 1
    count: dict[str, int] = {}
    for c, node in enumerate(view.node_of_core):
        if view.usable[c]:
            count[node] = count.get(node, 0) + 1
    return max(1, min(count.get(n, 1) for n in nodes))


def _need(job: Job) -> tuple[float, float]:
    return min(max(job.cpu_need, 1e-6), 1.0), min(max(job.mem, 0.0), 1.0)


class VcschedPolicy(SchedulingPolicy):
    needs: ClassVar[Needs] = Needs(levels=1, shared_vms=True)  # capped shared VMs on whole nodes
    algorithm: ClassVar[str] = "mcb8"
    dynamic: ClassVar[bool] = False
    parameters: ClassVar[Mapping[str, tuple[type, Any, str]]] = {
        "seed": (int, 0, "seed of the randomized algorithms (rrnd, rrnz)"),
        "time_limit": (float, 10.0, "MILP time limit per solve, seconds"),
        "max_attempts": (int, DEFAULT_MAX_ATTEMPTS, "GB/SGB bound on placement attempts"),
        "min_yield": (float, 0.0, "admit queued jobs only while the minimum yield stays >= this"),
    }

    def validate_params(self) -> None:
        if not 0.0 <= self.params["min_yield"] <= 1.0:
            raise PolicyParameterError(policy=self.name, param="min_yield", problem="must be in [0, 1]")
        if self.params["time_limit"] <= 0:
            raise PolicyParameterError(policy=self.name, param="time_limit", problem="must be > 0")
        if self.params["max_attempts"] < 1:
            raise PolicyParameterError(policy=self.name, param="max_attempts", problem="must be >= 1")
        if self.dynamic and self.params.get("migration_budget", 0.0) < 0:
            raise PolicyParameterError(policy=self.name, param="migration_budget", problem="must be >= 0")

    def _solve(self, inst: Instance, prev: np.ndarray[Any, np.dtype[np.int64]]) -> Solution:
        if self.dynamic:
            budget = float(self.params["migration_budget"])
            if self.algorithm == "milp":
                return dynamic_milp(inst, prev, budget, time_limit=self.params["time_limit"])
            return dynamic_mcb(inst, prev, budget)
        return solve(
            inst,
            self.algorithm,
            seed=self.params["seed"],
            time_limit=self.params["time_limit"],
            max_attempts=self.params["max_attempts"],
        )

    def decide(self, view: ClusterView, now: float) -> Decision:
        nodes = cluster_nodes(view)
        index = {n: i for i, n in enumerate(nodes)}
        per_host = host_cores(view, nodes)  # the instance is in host units: a need of x cores is x / per_host
        running = list(view.running.values())
        queued = [j for j in view.queue if j.submit_time <= now]
        if not nodes:
            return Decision(default_reason="vcsched: no usable node")

        def attempt(k: int) -> tuple[Solution, list[Job], np.ndarray[Any, np.dtype[np.int64]]] | None:
            jobs = [rj.job for rj in running] + queued[:k]
            if not jobs:
                return None
            inst = Instance.parallel(len(nodes), [(j.procs, _need(j)[0] / per_host, _need(j)[1]) for j in jobs])
            prev: list[int] = []
            for rj in running:
                for c in rj.cores[: rj.job.procs]:
                    node = view.node_of_core[c] if view.node_of_core and 0 <= c < len(view.node_of_core) else ""
                    prev.append(index.get(node, -1))
                prev += [-1] * (rj.job.procs - len(rj.cores))
            prev += [-1] * (inst.n_tasks - len(prev))
            sol = self._solve(inst, np.asarray(prev, dtype=np.int64))
            if sol.status == "infeasible" or not sol.placed or sol.min_yield < self.params["min_yield"] - 1e-9:
                return None
            return sol, jobs, np.asarray(prev, dtype=np.int64)

        best = attempt(len(queued))
        admitted = len(queued)
        if best is None:
            # largest admissible queue prefix; invariant: attempt(hi) fails, attempt(lo) works or lo == -1.
            # With nothing running, admitting nobody trivially works (attempt(0) has no instance to
            # solve): start at lo = 0, or a failing attempt(2) would hide a feasible attempt(1)
            lo, hi = (-1 if running else 0), len(queued)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                got = attempt(mid)
                if got is not None:
                    lo, best = mid, got
                else:
                    hi = mid
            admitted = max(lo, 0)
        if best is None:
            reason = "vcsched: the running jobs cannot be allocated" if running else "vcsched: no allocation found"
            return Decision(default_reason=reason)
        sol, jobs, _prev = best
        return Decision(
            actions=tuple(self._actions(view, nodes, sol, jobs, per_host)),
            default_reason=(
                f"vcsched: admitting it would leave no allocation with minimum yield >= {self.params['min_yield']}"
            )
            if admitted < len(queued)
            else "vcsched: waiting",
        )

    def _actions(self, view: ClusterView, nodes: Sequence[str], sol: Solution, jobs: list[Job],
                 per_host: int) -> list[Action]:
        out: list[Action] = []
        t = 0
        for job in jobs:
            hosts = sol.hosts[t : t + job.procs]
            cap = float(max(sol.alloc[t : t + job.procs])) * per_host  # host units -> cores
            t += job.procs
            names = tuple(nodes[h] for h in hosts)
            cap = min(cap, _need(job)[0])
            rj = view.running.get(job.id)
            if rj is not None and view.node_of_core:
                current = sorted(view.node_of_core[c] for c in rj.cores if 0 <= c < len(view.node_of_core))
                if current == sorted(names):
                    out.append(SetCap(job.id, cap))
                    continue
            out.append(PlaceShared(job.id, names, cap))
        return out


def _make(algorithm: str) -> type[VcschedPolicy]:
    cls = type(
        f"Vcsched_{algorithm}",
        (VcschedPolicy,),
        {
            "name": f"vcsched-{algorithm}",
            "summary": f"VCSCHED virtual clusters, {algorithm.upper()} (max-min yield, capped shared VMs)",
            "algorithm": algorithm,
        },
    )
    return register(cls)


POLICIES: dict[str, type[VcschedPolicy]] = {f"vcsched-{a}": _make(a) for a in ALGORITHMS}


@register
class VcschedDynamic(VcschedPolicy):
    name = "vcsched-dynamic"
    summary = "VCSCHED with a migration budget: MCB8 re-packing that keeps tasks where they are (sec. 6)"
    dynamic = True
    parameters: ClassVar[Mapping[str, tuple[type, Any, str]]] = {
        **VcschedPolicy.parameters,
        "migration_budget": (float, 1.0, "memory that may move per decision, in node-memory units"),
    }


@register
class VcschedDynMilp(VcschedDynamic):
    name = "vcsched-dyn-milp"
    summary = "VCSCHED with a migration budget: exact dynamic MILP of sec. 6.1 (HiGHS, small clusters)"
    algorithm = "milp"


POLICIES["vcsched-dynamic"] = VcschedDynamic
POLICIES["vcsched-dyn-milp"] = VcschedDynMilp
