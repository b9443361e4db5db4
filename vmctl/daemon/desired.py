"""Per-node desired VMs, derived from the job records' slots (one reader of the records for this
projection; ``vmctl.daemon.view`` is the other). Restoring the records restores the desired state.

Each slot of a job on a node is one VM: on level 0 a fg VM (the layout's fg weight), on a higher level a
bg VM (the bg weight; an operator's ``weight`` overrides both), an unpinned slot a shared (vcsched) VM
(core -1 on the wire). A gang job's VMs carry its row and replicas (``VmDesired.level``), a task bag's
workers the level of their slot; other jobs' VMs no level (-1: the agent's fg/bg pair). While a job
migrates, the source node keeps the leaving VM on its old core and level until the target is ready
(two-phase), and both sides carry the ``MigrationSpec``.
"""

from __future__ import annotations

from vmctl.daemon import dispatcher
from vmctl.daemon.state import ClusterState, source_level
from vmctl.nodedoc import MigrationSpec, PowerState, ProcessSpec, VmDesired, VmRole


def desired_vms(st: ClusterState, node: str) -> tuple[VmDesired, ...]:
    """The VMs node ``node`` must run, by name."""
    s = st.settings
    out: list[VmDesired] = []

    def role_of(level: int) -> VmRole:
        return VmRole.FG if level == 0 else VmRole.BG

    def weight_of(role: VmRole, override: int | None) -> int:
        if override is not None:
            return override
        return s.bg_weight if role is VmRole.BG else s.fg_weight

    for rec in st.jobs_on(node):
        job = st.job_obj(rec)
        moves: dict[int, dict[str, object]] = {}
        op = st.ops.get(rec.migrating) if rec.migrating else None
        if op is not None:
            moves = {int(m["index"]): m for m in op.detail.get("moves", [])}
        tasks = rec.spec.get("tasks") or []
        work = rec.spec.get("work_seconds")
        if work is None:  # a moldable job's mock work: its time at the width it was started with, on
            # standard cores (the mock backend runs every process at its host's speed, as it does a
            # task bag's tasks and a rigid job's work: one rule; ``moldable_time`` is the wall time)
            work = st.moldable_work(rec) or 0.0
        bag_shape = st.shape_of(rec) if rec.bag is not None else None
        for i, slot in enumerate(rec.slots):
            if slot.node != node and i not in moves:
                continue  # a process on another node, not moving from or to this one: not a VM of this node
            name = rec.vm_name(i)
            role = VmRole.SHARED if slot.shared else role_of(slot.level)
            proc: ProcessSpec | None
            if bag_shape is not None:  # a task bag's worker: the task the dispatcher handed it
                proc = dispatcher.process(rec, i, bag_shape, job.usage_of(0))
            else:
                t = tasks[i] if i < len(tasks) else {}
                # a shared (vcsched) VM's process uses its cpu_need of a core alone (the paper's alpha)
                # unless the spec says otherwise: capped at its need it runs at full pace (yield 1)
                usage = job.usage_of(i) if job.cpu_usage is not None or role is not VmRole.SHARED \
                    else min(1.0, job.cpu_need)
                proc = ProcessSpec(
                    job_id=rec.id, index=i, command=str(t.get("command", rec.spec.get("command", ""))),
                    work_seconds=float(t.get("work_seconds", work)),
                    cpu_usage=float(t.get("cpu_usage", usage)),
                )
            power = PowerState.RUNNING
            ckpt: str | None = None
            if rec.checkpointed:
                power = PowerState.SAVED
                ckpt = f"{s.checkpoint_dir}/{name}.save"
            elif rec.suspended:
                power = PowerState.PAUSED
            if rec.restore_pending:
                ckpt = ckpt or f"{s.checkpoint_dir}/{name}.save"
            mv = moves.get(i)
            mig: MigrationSpec | None = None
            core = slot.wire_core
            # a gang job's VMs carry its row (the agent sets weight and power by the active row), a bag's
            # workers the level of their slot, other jobs' VMs none
            vm_level = slot.level if rec.gang or rec.bag is not None else -1
            vm_role, vm_weight = role, weight_of(role, rec.weight)
            emit = slot.node == node
            if mv is not None and op is not None:
                src = mv["from"]
                dst = mv["to"]
                assert isinstance(src, list | tuple) and isinstance(dst, list | tuple)
                if src[0] != dst[0]:
                    spec = MigrationSpec(
                        migration_id=str(op.id), source_node=str(src[0]), target_node=str(dst[0]),
                        target_core=int(dst[1]), phase="requested",  # -1: a shared VM stays unpinned
                        mode="checkpoint" if str(mv.get("mode", "live")) == "checkpoint" else "live",
                    )
                    if node == src[0]:
                        # two-phase: the source starts only once the target applied the generation
                        # that expects the VM (else the target would prune the arriving VM)
                        core = int(src[1])
                        # the leaving VM keeps the level of the slot it holds (reserved in the view) until
                        # it is gone: a bg VM promoted by moving stays bg here, so it never collides with a
                        # fg VM placed on its old core meanwhile
                        if not slot.shared:
                            left = source_level(op, rec)
                            if role_of(left) is not vm_role:
                                vm_role, vm_weight = role_of(left), weight_of(role_of(left), None)
                            if rec.gang:  # a gang job: its old row, likewise
                                vm_level = left
                        mig = spec if op.detail.get("stage") == "go" else None
                        emit = True
                    elif node == dst[0]:
                        mig = spec
                    if spec.mode == "checkpoint":
                        ckpt = ckpt or f"{s.checkpoint_dir}/{name}.save"
            if not emit:
                continue
            out.append(VmDesired(
                name=name, core=core, role=vm_role, weight=vm_weight, cap=rec.cap, power=power, process=proc,
                checkpoint_path=ckpt, migration=mig, memory_mib=s.memory_mib, level=vm_level,
                replicas=tuple(rec.replicas),
            ))
    out.sort(key=lambda v: v.name)
    return tuple(out)
