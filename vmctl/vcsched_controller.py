"""Virtual-cluster controller: VCSCHED on real hosts (Casanova et al., RR-6692, sec. 2.1 and 6).

The controller is the paper's Resource Allocator. It takes virtual-cluster requests (``n`` VMs, each
needing ``cpu`` and ``mem`` as fractions of one node), runs a vcsched algorithm, and produces the
desired state of every node: one ``VmRole.SHARED`` VM per virtual-cluster VM, unpinned
(``core = -1``), with ``cap`` = the CPU fraction the algorithm allocated (the same for all VMs of a
cluster, sec. 5) and ``memory_mib`` = ``mem`` x the node's memory. The agents reconcile that state
through their backend (libvirt: ``vcpu_quota``/Xen cap; mock: its CPU model).

When the workload changes (``submit``, ``update``, ``remove``) the next ``run_once`` re-allocates:

* ``migration_budget=None``: the static algorithm re-packs from scratch (any VM may move);
* ``migration_budget=B``: the dynamic heuristic (``dyn-mcb``; ``algorithm="milp"`` selects the
  dynamic MILP) keeps VMs where they are unless moving at most ``B`` of memory (node-memory units)
  raises the minimum yield (sec. 6).

A VM that changes node gets a ``MigrationSpec`` (live by default) in the desired state of both nodes;
the agents advance it, and ``observe(NodeObserved)`` with the source's report completes it (the VM
then lives on the target only) or, if it failed, puts the VM back on its source. While migrations are
in flight, re-allocation treats their VMs as already on the target and moves nothing else.

Admission: requests are considered in submission order; when not all fit, the newest are left
waiting (``Allocation.waiting``) until a later ``run_once`` finds room, as the paper's RA may
"reject or delay" requests.

API (for the daemon's vcsched mode): ``submit(VcRequest)``, ``update(VcRequest)``, ``remove(id)``,
``run_once() -> Allocation``, ``desired(node) -> NodeDesired``, ``observe(NodeObserved)``.
Everything is in memory and deterministic; the daemon persists requests and re-submits on restart
(VMs keep running: the first ``run_once`` after a restart should be given their nodes with
``adopt(vm_name, node)`` so nothing moves needlessly).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from vmctl.errors import Conflict, NotFound, ValidationError
from vmctl.model import MigrationSpec, NodeDesired, NodeObserved, VmDesired, VmRole
from vmctl.policies.vcsched.algorithms import ALGORITHMS, solve
from vmctl.policies.vcsched.dynamic import dynamic_mcb, dynamic_milp, migration_cost
from vmctl.policies.vcsched.instance import Instance, Solution


@dataclass(frozen=True)
class VcRequest:
    """A virtual cluster: ``vms`` VMs, each needing ``cpu`` (0, 1] and ``mem`` [0, 1] of one node."""

    id: str
    vms: int
    cpu: float
    mem: float

    def __post_init__(self) -> None:
        if not self.id or any(ch.isspace() or ch == "/" for ch in self.id):
            raise ValidationError(
                field="request.id", problem=f"must be a non-empty name without spaces or '/': {self.id!r}"
            )
        if self.vms < 1:
            raise ValidationError(field=f"request {self.id}.vms", problem=f"must be >= 1, got {self.vms}")
        if not (0.0 < self.cpu <= 1.0 and math.isfinite(self.cpu)):
            raise ValidationError(field=f"request {self.id}.cpu", problem=f"must be in (0, 1], got {self.cpu}")
        if not (0.0 <= self.mem <= 1.0 and math.isfinite(self.mem)):
            raise ValidationError(field=f"request {self.id}.mem", problem=f"must be in [0, 1], got {self.mem}")

    def vm_names(self, prefix: str = "vc-") -> list[str]:
        return [f"{prefix}{self.id}-{k}" for k in range(self.vms)]


@dataclass(frozen=True)
class Allocation:
    status: Literal["ok", "infeasible", "timeout"]
    min_yield: float
    avg_yield: float
    admitted: tuple[str, ...]
    waiting: tuple[str, ...]
    placement: Mapping[str, str]  # VM name -> node
    caps: Mapping[str, float]  # VM name -> CPU fraction of its node
    migrations: tuple[MigrationSpec, ...]
    moved_mem: float
    desired: Mapping[str, NodeDesired] = field(default_factory=dict)


class VcschedController:
    def __init__(
        self,
        nodes: Sequence[str],
        algorithm: str = "mcb8",
        migration_budget: float | None = None,
        node_memory_mib: int = 16384,
        weight: int = 1000,
        seed: int = 0,
        time_limit: float = 10.0,
        migration_mode: Literal["live", "checkpoint"] = "live",
        vm_prefix: str = "vc-",
    ) -> None:
        if not nodes or len(set(nodes)) != len(nodes):
            raise ValidationError(field="controller.nodes", problem="must list distinct node names")
        if algorithm not in ALGORITHMS:
            raise ValidationError(
                field="controller.algorithm", problem=f"unknown {algorithm!r} (known: {', '.join(ALGORITHMS)})"
            )
        if migration_budget is not None and not migration_budget >= 0:
            raise ValidationError(field="controller.migration_budget", problem=f"must be >= 0, got {migration_budget}")
        self.nodes = list(nodes)
        self.algorithm = algorithm
        self.migration_budget = migration_budget
        self.node_memory_mib = node_memory_mib
        self.weight = weight
        self.seed = seed
        self.time_limit = time_limit
        self.migration_mode: Literal["live", "checkpoint"] = migration_mode
        if not vm_prefix or any(ch.isspace() or ch == "/" for ch in vm_prefix):
            raise ValidationError(
                field="controller.vm_prefix", problem=f"must be non-empty, no spaces or '/': {vm_prefix!r}"
            )
        self.vm_prefix = vm_prefix
        self._owner: dict[str, str] = {}  # VM name -> request id
        self.requests: dict[str, VcRequest] = {}
        self.home: dict[str, str] = {}  # VM -> node it runs on (the source while it migrates)
        self.caps: dict[str, float] = {}
        self.pending: dict[str, MigrationSpec] = {}  # VM -> in-flight migration
        self.generation: dict[str, int] = {n: 0 for n in self.nodes}
        self._desired: dict[str, NodeDesired] = {n: NodeDesired(n, 0) for n in self.nodes}
        self._migration_seq = 0
        self.last: Allocation | None = None

    # ------------------------------------------------------------------ requests

    def submit(self, req: VcRequest) -> None:
        if req.id in self.requests:
            raise Conflict(what=f"virtual cluster {req.id}", problem="already exists")
        self.requests[req.id] = req

    def update(self, req: VcRequest) -> None:
        old = self.requests.get(req.id)
        if old is None:
            raise NotFound(kind="virtual cluster", name=req.id)
        self.requests[req.id] = req
        for name in old.vm_names(self.vm_prefix)[req.vms :]:
            self._forget(name)

    def remove(self, vc_id: str) -> None:
        old = self.requests.pop(vc_id, None)
        if old is None:
            raise NotFound(kind="virtual cluster", name=vc_id)
        for name in old.vm_names(self.vm_prefix):
            self._forget(name)

    def adopt(self, vm_name: str, node: str) -> None:
        """Record where an existing VM runs (after a controller restart)."""
        if node not in self.nodes:
            raise NotFound(kind="node", name=node)
        self.home[vm_name] = node

    def _forget(self, name: str) -> None:
        self.home.pop(name, None)
        self.caps.pop(name, None)
        self.pending.pop(name, None)

    # ------------------------------------------------------------------ allocation

    def _instance(self, reqs: Sequence[VcRequest]) -> tuple[Instance, np.ndarray, list[str]]:
        index = {n: i for i, n in enumerate(self.nodes)}
        inst = Instance.parallel(len(self.nodes), [(r.vms, r.cpu, r.mem) for r in reqs])
        names = [name for r in reqs for name in r.vm_names(self.vm_prefix)]
        for r in reqs:
            for name in r.vm_names(self.vm_prefix):
                self._owner[name] = r.id
        prev = []
        for name in names:
            mig = self.pending.get(name)
            node = mig.target_node if mig is not None else self.home.get(name)
            prev.append(index.get(node, -1) if node is not None else -1)
        return inst, np.asarray(prev, dtype=np.int64), names

    def _solve(self, inst: Instance, prev: np.ndarray) -> Solution:
        budget = self.migration_budget
        if self.pending:
            budget = 0.0  # one round of migrations at a time
        if budget is None or not (prev >= 0).any():
            return solve(inst, self.algorithm, seed=self.seed, time_limit=self.time_limit)
        if self.algorithm == "milp":
            return dynamic_milp(inst, prev, budget, time_limit=self.time_limit)
        return dynamic_mcb(inst, prev, budget)

    def run_once(self) -> Allocation:
        reqs = list(self.requests.values())
        best: tuple[Solution, Instance, np.ndarray, list[str], int] | None = None
        k = len(reqs)
        while k > 0:  # admission: the longest prefix (submission order) that can be allocated
            inst, prev, names = self._instance(reqs[:k])
            sol = self._solve(inst, prev)
            if sol.placed:
                best = (sol, inst, prev, names, k)
                break
            k -= 1
        if best is None:
            alloc = Allocation("infeasible" if reqs else "ok", 0.0, 0.0, (), tuple(r.id for r in reqs), {}, {}, (), 0.0)
            # nothing admitted: VMs that were running keep their last state
            self.last = replace(alloc, desired=dict(self._desired))
            return self.last
        sol, inst, prev, names, k = best
        placement: dict[str, str] = {}
        caps: dict[str, float] = {}
        migrations: list[MigrationSpec] = []
        for t, name in enumerate(names):
            node = self.nodes[sol.hosts[t]]
            placement[name] = node
            caps[name] = min(float(sol.alloc[t]), 1.0)
            src = self.home.get(name)
            mig = self.pending.get(name)
            if mig is not None:
                migrations.append(mig)
            elif src is not None and src != node:
                self._migration_seq += 1
                mig = MigrationSpec(
                    migration_id=f"{name}-m{self._migration_seq}",
                    source_node=src,
                    target_node=node,
                    target_core=-1,  # unpinned on arrival, as on the source
                    mode=self.migration_mode,
                )
                self.pending[name] = mig
                migrations.append(mig)
            elif src is None:
                self.home[name] = node
        admitted = {n for r in reqs[:k] for n in r.vm_names(self.vm_prefix)}
        for name in [n for n in self.home if n not in admitted]:
            self._forget(name)
        self.caps = caps
        self._publish()
        self.last = Allocation(
            sol.status,
            sol.min_yield,
            sol.avg_yield,
            tuple(r.id for r in reqs[:k]),
            tuple(r.id for r in reqs[k:]),
            placement,
            caps,
            tuple(migrations),
            migration_cost(inst, prev, sol.hosts),
            dict(self._desired),
        )
        return self.last

    # ------------------------------------------------------------------ desired state

    def _vm(self, name: str, mig: MigrationSpec | None) -> VmDesired:
        req = self.requests[self._owner[name]]
        return VmDesired(
            name=name,
            core=-1,
            role=VmRole.SHARED,
            weight=self.weight,
            cap=self.caps[name],
            migration=mig,
            memory_mib=max(1, round(req.mem * self.node_memory_mib)),
        )

    def _publish(self) -> None:
        per: dict[str, list[VmDesired]] = {n: [] for n in self.nodes}
        for name in sorted(self.caps):
            mig = self.pending.get(name)
            if mig is None:
                per[self.home[name]].append(self._vm(name, None))
            else:
                vm = self._vm(name, mig)
                per[mig.source_node].append(vm)
                per[mig.target_node].append(vm)
        for node, vms in per.items():
            old = self._desired[node]
            if old.vms != tuple(vms):
                self.generation[node] += 1
                self._desired[node] = NodeDesired(node, self.generation[node], tuple(vms))

    def desired(self, node: str) -> NodeDesired:
        if node not in self._desired:
            raise NotFound(kind="node", name=node)
        return self._desired[node]

    def observe(self, observed: NodeObserved) -> None:
        """Advance migrations from an agent's report (the source node's report decides)."""
        changed = False
        for vm in observed.vms:
            mig = self.pending.get(vm.name)
            if mig is None or mig.source_node != observed.node:
                continue
            if vm.migration_phase == "completed":
                self.home[vm.name] = mig.target_node
                del self.pending[vm.name]
                changed = True
            elif vm.migration_phase in ("failed", "aborted"):
                del self.pending[vm.name]  # stays on its source; a later run_once may retry
                changed = True
        if changed:
            self._publish()
