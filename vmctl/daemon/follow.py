"""Follow the agents' reports until every action of the daemon is confirmed: a process's start and
exit (a job ends when its last process has), a task bag's task ends (``vmctl.daemon.dispatcher``), and
the multi-step operations (``OperationRecord``: migrate, checkpoint, restore). A migration is two-phase:
``prepare`` until every target applied the generation that expects the VM (or lists it), then ``go``
until every VM arrived and left its source; a refusal or a failed phase rolls it back
(``RecordWriter.rollback_migration``)."""

from __future__ import annotations

from typing import Any

from vmctl.daemon import dispatcher, history
from vmctl.daemon.records import Changes, RecordWriter
from vmctl.daemon.state import ACTIVE, parse_vm_name
from vmctl.model import JobState
from vmctl.nodedoc import NodeObserved, PowerState, VmObserved
from vmctl.store.base import JobRecord, OperationRecord


def seen_at(v: VmObserved, obs: NodeObserved | None, now: float, job: JobRecord) -> float:
    """When the agent saw ``v``'s job process start, on this daemon's clock: ``now`` less how long before
    its report the agent saw it (``VmObserved.process_started_at`` against ``NodeObserved.time``, both the
    agent's clock, so a skew between the clocks does not count), never before the run's start; ``now``
    from an agent that does not say."""
    if v.process_started_at is None or obs is None or obs.time <= 0:
        return now
    at = now - max(0.0, obs.time - v.process_started_at)
    start = history.started_at(job)
    return at if start is None else min(now, max(at, start))


class Follower(RecordWriter):
    """The agents' reports, applied to the job records and operations."""

    def observe(self, obs: NodeObserved, now: float, ch: Changes) -> None:
        st = self.state
        st.set_observed(obs)
        seen: dict[str, Any] = {}
        opened: set[str] = set()  # jobs whose run was opened by this report (once: O(processes) each)
        for v in obs.vms:
            parsed = parse_vm_name(v.name)
            if parsed is None:
                continue
            jid, run, idx = parsed
            seen[v.name] = v
            job = st.jobs.get(jid)
            if job is not None and job.bag is not None:
                if job.run == run and job.state == JobState.RUNNING:
                    self._observe_worker(job, idx, v, obs.node, now, ch)
                continue
            if job is None or job.run != run or job.state not in ACTIVE or idx >= len(job.tasks):
                continue
            slots = job.slots
            if slots and idx < len(slots) and slots[idx].node != obs.node and not job.migrating:
                continue  # a stale copy on a node the process left
            task = job.tasks[idx]
            if task.get("seen") is False and v.process_job == jid and v.process_index == idx \
                    and not v.process_starting:
                # the first report that shows this process started: its run is modelled from when the agent saw
                # it start, not from the decision that placed it (an agent may have learnt of it only after a
                # daemon restart), nor from this report (a short process's start may come with its exit)
                at = seen_at(v, obs, now, job)
                task["seen"] = True
                task["seen_at"] = at
                if job.state == JobState.RUNNING and not job.migrating:
                    job.progress_base = 0.0
                    job.tier_since = at if job.id not in opened else max(at, job.tier_since or at)
                    if job.id not in opened:  # the same for every process of the report
                        opened.add(job.id)
                        st.open_run(job)
                if all(t.get("seen", True) for t in job.tasks):
                    # the run's boot ends when its last process started (export: ``boot``)
                    last = max((float(t["seen_at"]) for t in job.tasks if t.get("seen_at") is not None), default=now)
                    history.note_running(job, last, len(job.tasks))
                ch.jobs[job.id] = job
            if task["exit_status"] is None:
                if v.process_exit is not None:
                    task["exit_status"] = int(v.process_exit)
                    ch.jobs[job.id] = job
                elif v.power is PowerState.CRASHED:
                    task["exit_status"] = -1
                    task["error"] = "VM crashed"
                    ch.jobs[job.id] = job
            if job.tasks and all(t["exit_status"] is not None for t in job.tasks):
                ok = all(t["exit_status"] == 0 for t in job.tasks)
                self.stop_job(ch, job, now, JobState.DONE if ok else JobState.FAILED,
                              "finished" if ok else "a process exited with a non-zero status")
        # operations waiting for this node
        for op in [o for o in st.ops.values() if o.state == "pending"]:
            job = st.jobs.get(op.job_id)
            if job is None:
                continue
            if op.kind == "migrate":
                self._follow_migration(op, job, now, ch)
            elif op.kind in ("checkpoint", "restore"):
                want = PowerState.SAVED if op.kind == "checkpoint" else PowerState.RUNNING
                nodes = {str(p[0]) for p in op.detail.get("placement", [])}
                if obs.node not in nodes:
                    continue
                ok = True
                for i, (n, _c) in enumerate(op.detail.get("placement", [])):
                    o = st.observed.get(str(n))
                    vm = next((v for v in o.vms if v.name == job.vm_name(i)), None) if o else None
                    if vm is None or vm.power is not want:
                        ok = False
                        break
                if ok:
                    self.close_op(ch, op, "done", now)
                    if op.kind == "restore":
                        job.restore_pending = False
                        self.touch(ch, job)
                    ch.events.append(f"{op.kind} {op.id} done")

    def _observe_worker(self, job: JobRecord, vm_number: int, v: Any, node: str, now: float, ch: Changes) -> None:
        """A task bag's worker VM in a report: the dispatcher records a task's end and hands the worker
        its next task (a changed desired state); the job ends when its last task has."""
        i = job.bag["vms"].index(vm_number) if job.bag is not None and vm_number in job.bag["vms"] else -1
        if i < 0 or job.placement[i][0] != node:
            return  # a worker that left, or a stale copy on another node
        held = len(job.placement)
        bag = job.bag
        if bag is not None and v.process_job == job.id and not v.process_starting and not bag.get("running"):
            # the workers seen running a task of this run (their guests booted), and when
            up: dict[str, float] = bag.setdefault("up", {})
            up_on: dict[str, str] = bag.setdefault("up_on", {})  # and on which node (export: node_boots)
            if str(vm_number) not in up:
                up[str(vm_number)] = seen_at(v, self.state.observed.get(node), now, job)
                up_on[str(vm_number)] = node
                if all(str(n) in up for n in bag["vms"]):
                    bag["running"] = True
                    history.note_running(job, now, len(bag["vms"]), [up[str(n)] for n in bag["vms"]],
                                         [up_on.get(str(n), "") for n in bag["vms"]])
                    ch.jobs[job.id] = job
                ch.bags[job.id] = job
        if not dispatcher.observe(job, vm_number, v, now):
            return
        if len(job.placement) == held and not dispatcher.finished(job):  # the worker took its next task
            ch.bags[job.id] = job
            ch.desired_nodes |= self.state.reindex(job)
            return
        self.touch(ch, job)
        if dispatcher.finished(job):
            failed = any(t["exit_status"] != 0 for t in job.tasks)
            self.stop_job(ch, job, now, JobState.FAILED if failed else JobState.DONE,
                          "a task exited with a non-zero status" if failed else "finished")
        elif len(job.placement) < held:
            ch.events.append(f"job {job.id} released a worker")  # the decision maker runs (passive)

    def _follow_migration(self, op: OperationRecord, job: JobRecord, now: float, ch: Changes) -> None:
        st = self.state
        for host in op.detail.get("hosts", []):  # an agent refused this migration: take it back at once
            o = st.observed.get(str(host))
            ref = next((r for r in o.refusals if r.migration_id == op.id), None) if o is not None else None
            if ref is not None:
                self.rollback_migration(op, job, now, ch, f"the agent of {host} refused it: {ref.reason}")
                return
        if op.detail.get("stage") == "prepare":
            # the target is ready when it applied the generation that expects the VM, or when its report
            # already lists the incoming VM (the agent reports it as absent, phase "waiting")
            gens: dict[str, int] = op.detail.get("target_gens") or {}
            ready = True
            for m in op.detail.get("moves", []):
                t = str(m["to"][0])
                if m["from"][0] == m["to"][0]:
                    continue
                o = st.observed.get(t)
                name = job.vm_name(int(m["index"]))
                if o is None or not (o.generation_applied >= gens.get(t, 1 << 62)
                                     or any(v.name == name for v in o.vms)):
                    ready = False
                    break
            if ready:
                op.detail["stage"] = "go"
                op.updated = now
                ch.ops[op.id] = op
                self.touch(ch, job)
            return
        done = True
        for m in op.detail.get("moves", []):
            src, dst = m["from"], m["to"]
            if src[0] == dst[0]:
                continue
            name = job.vm_name(int(m["index"]))
            s_obs, d_obs = st.observed.get(str(src[0])), st.observed.get(str(dst[0]))
            s_vm = next((v for v in s_obs.vms if v.name == name), None) if s_obs else None
            d_vm = next((v for v in d_obs.vms if v.name == name), None) if d_obs else None
            for v in (s_vm, d_vm):
                if v is not None and v.migration_phase in ("failed", "aborted"):
                    self.rollback_migration(op, job, now, ch, f"agent reported {v.migration_phase}")
                    return
            arrived = d_vm is not None and d_vm.power in (PowerState.RUNNING, PowerState.PAUSED) and \
                d_vm.migration_phase in (None, "completed", "arrived")
            left = s_vm is None or s_vm.migration_phase == "completed" or s_vm.power is PowerState.ABSENT
            if not (arrived and left):
                done = False
        if done:
            self.close_op(ch, op, "done", now)
            job.migrating = None
            job.migrations += 1
            job.tier_since = now
            self.touch(ch, job)
            ch.events.append(f"migration {op.id} done")
