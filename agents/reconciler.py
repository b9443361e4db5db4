"""The agent's loop: fetch desired -> validate -> relist -> plan -> apply -> report.

``Reconciler.run_once()`` does one cycle and returns what happened; ``run()`` repeats it, waiting
for a backend event (events only wake the loop), for the periodic full resync (the safety net) or,
after a retryable failure, for an exponential backoff (capped). The hypervisor is the authority: every
cycle starts from a fresh ``list_vms``; the reconciler keeps no VM state of its own besides CPU-time
samples (for utilization) and the last valid desired state.

Bad desired state (unknown core, weight or cap out of range, two fg VMs on a core, ...) is rejected as
a whole by ``plan.validate`` before anything is applied; the agent reports the error and keeps
reconciling toward the last valid desired state. A migration this node cannot carry out (its target
is not in ``peers``) is refused alone (``plan.accept``): the rest of the generation is applied and the
refusal is reported (``NodeObserved.refusals``) until the daemon takes that migration back. A
failing action does not stop the other VMs' actions; the remaining actions of *that* VM are skipped
in this pass. After applying, the reconciler relists and plans again (up to ``max_passes``) so
multi-step changes (restore, then pin and tune; start, then start the job process) converge in one
cycle.

A forced stop runs off the pass (``background_stops``; by default where the backend's stops are slow,
``HypervisorBackend.slow_stops``: libvirt), as a live migration does: libvirt's
destroy of a guest took 46-223 s here while other guests spun (docs/libvirt.md), and
a pass that waits for it applies nothing else meanwhile (no row switch, no report). The VM is reported
with ``stopping`` until the stop ended; the plan leaves it alone meanwhile (``Observed.stopping``: no
second stop, no undefine, no start); the end of the stop wakes the loop, whose next pass undefines it.
A cycle with a stop under way is not converged (the generation is not applied yet). An agent killed
during a stop leaves the domain as libvirtd has it (being destroyed, or still there): the next agent's
relist finds it and its plan stops (again) and removes it.

Process start times: the first pass that sees a job process started (``ProcessStatus.started``) records
the time on the agent's clock, earlier by what the runner says it saw (``ProcessStatus.started_ago_s``),
and every report carries it (``VmObserved.process_started_at``): a report that comes later (a short
process that started and ended between two reports) still says when it started.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

from vmctl.agents.backends.base import (
    BootAware,
    Capability,
    HypervisorBackend,
    MigrationStatus,
    ProcessRunner,
    ProcessStatus,
    VmInfo,
)
from vmctl.agents.layout import META_MANAGED, META_NODE, Layout, memory_problem
from vmctl.agents.plan import (
    AbortMigration,
    Action,
    CheckpointVm,
    Claim,
    Define,
    KillProcess,
    Observed,
    Pin,
    RestoreVm,
    Resume,
    Start,
    StartMigration,
    StartProcess,
    Stop,
    Suspend,
    TransferCheckpoint,
    Tune,
    Undefine,
    accept,
    plan,
)
from vmctl.agents.sources import DesiredStateSource, Reporter
from vmctl.clock import Clock, SystemClock
from vmctl.errors import (
    HypervisorError,
    OperationNotSupported,
    OutOfRange,
    ValidationError,
    VmctlError,
    VmNotFound,
    VmStateError,
)
from vmctl.model import Discipline, NodeLayout
from vmctl.nodedoc import MigrationRefusal, NodeDesired, NodeObserved, PowerState, VmDesired, VmObserved

log = logging.getLogger("vmctl.agent")
#: row switches whose durations a reconciler keeps (``switch_seconds``)
SWITCH_KEEP = 256
#: real seconds an agent wakes after a slice boundary (so the clock has passed it)
SWITCH_SLACK_S = 0.002


@dataclass
class Backoff:
    """Exponential backoff: ``initial * factor**n`` seconds after the n-th consecutive failure, at
    most ``maximum``."""

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 30.0
    failures: int = 0

    def next_delay(self) -> float:
        d = min(self.maximum, self.initial * self.factor ** min(self.failures, 64))
        self.failures += 1
        return d

    def reset(self) -> None:
        self.failures = 0


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    generation: int | None  # the desired generation this cycle worked toward (None: bare layout)
    applied: tuple[Action, ...]  # actions that succeeded
    errors: tuple[str, ...]
    retry: bool  # a retryable failure happened: next cycle after ``delay``
    converged: bool  # the last plan was empty
    delay: float  # seconds until the next cycle (backoff or resync)
    observed: NodeObserved | None = None
    failed: tuple[Action, ...] = field(default=())


class _AbortPass(Exception):
    def __init__(self, error: VmctlError) -> None:
        super().__init__(str(error))
        self.error = error


class Reconciler:
    def __init__(
        self,
        backend: HypervisorBackend,
        layout: Layout,
        source: DesiredStateSource,
        reporter: Reporter | None = None,
        clock: Clock | None = None,
        runner: ProcessRunner | None = None,
        peers: Mapping[str, str] | None = None,
        migrate_uris: Mapping[str, str] | None = None,
        resync_seconds: float = 30.0,
        backoff: Backoff | None = None,
        max_passes: int = 4,
        transfer: Callable[[str, str, str], int] | None = None,
        checkpoint_peers: Collection[str] | None = None,
        fence: Callable[[int | None], bool] | None = None,
        host_memory_mib: int | None = None,
        background_stops: bool | None = None,
    ) -> None:
        self.backend = backend
        self.layout = layout
        #: the config's layout: the default until a desired state names one (``NodeDesired.layout``)
        self.base_layout = layout
        #: the host's memory for the admission of a new layout (None: what the backend reports)
        self.host_memory_mib = host_memory_mib
        self.relayouts = 0  # times the host was laid out anew on vmctld's word
        self._raw: NodeDesired | None = None  # the last desired document as fetched (not completed)
        self._relayout_waits = False  # a new layout waits for job VMs to leave the host
        self.source = source
        self.reporter = reporter
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.runner = runner
        self.peers = dict(peers or {})
        self.migrate_uris = dict(migrate_uris or {})
        self.resync_seconds = resync_seconds
        self.backoff = backoff if backoff is not None else Backoff()
        self.max_passes = max_passes
        self.transfer = transfer  # (src_path, target node, dst_path) -> bytes; None = shared storage
        # nodes that checkpoint files can be sent to (sftp: checkpoints.hosts); None = shared storage
        self.checkpoint_peers = None if checkpoint_peers is None else frozenset(checkpoint_peers)
        self._refused: tuple[MigrationRefusal, ...] = ()  # migrations of the last valid desired state refused
        self._transferred: set[str] = set()
        #: self-fencing (``vmctl.agents.http_source.Liveness.fenced``): called with the desired generation
        #: worked on; True = no contact with vmctld for too long: pause the job VMs, start nothing
        self.fence = fence
        self.fenced = False  # the last plan was a fenced one
        self.cycles = 0
        self._desired: NodeDesired | None = None  # last valid desired state (completed with the layout)
        #: timeslice layouts: the row whose VMs run (``switch_row``, or the slice clock of desired state:
        #: ``NodeDesired.slices``); the others are paused or soak
        self.active_row = 0
        #: row switches made on the slice clock, and the seconds each took to apply (its cycle: pause the
        #: rows going inactive, resume the active one), the latest ``SWITCH_KEEP``
        self.row_switches = 0
        self.switch_seconds: list[float] = []
        #: called with the seconds of each row switch (the agent's metrics)
        self.on_switch: Callable[[float], None] | None = None
        self._generation_applied = 0
        self._samples: dict[str, tuple[float, float]] = {}
        self._util: dict[str, float] = {}
        self._last_vms: tuple[VmObserved, ...] = ()
        #: VMs a desired state this agent held put on this node (not as a migration's target): removing one
        #: of them once vmctld drops it is the normal end of a run; any other VM of ours that no desired
        #: state wants is an *orphan* (left behind: arrived after its job ended, or from before a restart)
        self._owned: set[str] = set()
        self._wake = threading.Event()
        self._subscribed = False
        #: forced stops run on threads of their own (module docstring): the VMs whose stop is under way,
        #: and the stops that failed since the last cycle (reported by the next)
        self.background_stops = backend.slow_stops if background_stops is None else background_stops
        self._stops: dict[str, threading.Thread] = {}
        self._stop_failures: list[tuple[str, VmctlError]] = []
        self._stops_lock = threading.Lock()
        #: (VM, job, index) -> when this agent saw that process started (its clock)
        self._proc_started: dict[tuple[str, str, int], float] = {}

    # ------------------------------------------------------------------ events

    def wake(self) -> None:
        self._wake.set()

    def _subscribe(self) -> None:
        if self._subscribed or Capability.EVENTS not in self.backend.capabilities():
            return
        try:
            self.backend.subscribe(lambda ev: self.wake())
            self._subscribed = True
        except VmctlError as exc:
            log.warning("cannot subscribe to backend events (periodic resync only): %s", exc)

    def switch_row(self, row: int) -> None:
        """Make ``row`` the active row of a timeslice layout: the next cycle resumes its VMs at the
        highest weight and pauses (or, with ``inactive: soak``, lowers) the other rows' VMs. What calls
        it on a clock: ``run_once`` with a slice schedule in desired state (``_slice_clock``)."""
        if self.layout.discipline is not Discipline.TIMESLICE:
            raise ValidationError(field="active row",
                                  problem=f"only a timeslice layout has rows; {self.layout.host} is "
                                          f"{self.layout.discipline.value}")
        if not 0 <= row < self.layout.levels:
            raise OutOfRange(what="active row", value=row, allowed=f"0..{self.layout.levels - 1} on {self.layout.host}")
        self.active_row = row
        self.wake()

    def _slice_clock(self, desired: NodeDesired | None, errors: list[str]) -> tuple[bool, float | None]:
        """Follow the slice schedule of ``desired`` (timeslice layouts): make the row active now the
        active row. Returns (whether the row changed, seconds of this clock until the next switch; None
        when there is no schedule). No decision or new generation is needed per slice: the schedule
        (epoch, T, row order) is enough to know the row at any time, also after an agent restart."""
        sl = desired.slices if desired is not None else None
        if sl is None or self.layout.discipline is not Discipline.TIMESLICE:
            return False, None
        now = self.clock.now()
        row = sl.active_row(now)
        if not 0 <= row < self.layout.levels:
            errors.append(f"slices: row {row} out of range 0..{self.layout.levels - 1} on {self.layout.host}")
            return False, max(0.0, sl.next_switch(now) - now)
        changed = row != self.active_row
        self.active_row = row
        return changed, max(0.0, sl.next_switch(now) - now)

    # ------------------------------------------------------------------ one cycle

    def run_once(self) -> ReconcileResult:
        self.cycles += 1
        self._subscribe()
        errors: list[str] = []
        desired, prune, retry = self._fetch(errors)
        if desired is not None:
            host = self.layout.host
            self._owned.update(v.name for v in desired.vms if v.migration is None or v.migration.source_node == host)
        t_switch = time.perf_counter()
        switched, to_switch = self._slice_clock(desired, errors)
        target = self.layout.shape(desired if desired is not None else self.layout.base_desired(0), self.active_row)
        applied: list[Action] = []
        failed: list[Action] = []
        with self._stops_lock:
            stop_failures, self._stop_failures = self._stop_failures, []
        for vm, exc in stop_failures:  # a stop that ran off the last cycle's pass failed: the plan tries again
            failed.append(Stop(vm))
            retry = retry or exc.retryable
            errors.append(f"stop {vm}: {exc.reference}: {exc}")
        converged = False
        observation: Observed | None = None
        for _ in range(self.max_passes):
            if self._relayout_waits and self._retake_layout(errors):  # the last job VMs left in the last pass
                desired = self._desired
                target = self.layout.shape(desired if desired is not None else self.layout.base_desired(0),
                                           self.active_row)
            try:
                observation = self._observe(target)
            except _AbortPass as exc:
                errors.append(f"observe: {exc.error.reference}: {exc.error}")
                retry = retry or exc.error.retryable
                observation = None
                break
            actions = self._plan(target, observation, prune)
            if not actions:
                converged = True
                break
            bad_vms: set[str] = set()
            pass_failed = False
            stopping = False  # a stop went off the pass: what comes after the stops is planned again
            for act in actions:
                if act.vm in bad_vms:
                    continue
                if stopping and not isinstance(act, Stop | KillProcess | AbortMigration | CheckpointVm):
                    continue  # the next pass plans it knowing which VMs are still stopping (their cores)
                if isinstance(act, Stop) and self.background_stops:
                    self._stop_off_pass(act.vm)
                    applied.append(act)
                    bad_vms.add(act.vm)  # its other actions (undefine, start) wait for the stop's end
                    stopping = True
                    continue
                try:
                    self._apply(act)
                    applied.append(act)
                except VmctlError as exc:
                    failed.append(act)
                    bad_vms.add(act.vm)
                    pass_failed = True
                    retry = retry or exc.retryable
                    errors.append(f"{act.kind} {act.vm}: {exc.reference}: {exc}")
                    log.warning("%s %s failed: %s", act.kind, act.vm, exc)
            if pass_failed:
                try:
                    observation = self._observe(target)
                except _AbortPass as exc:
                    errors.append(f"observe: {exc.error.reference}: {exc.error}")
                    retry = retry or exc.error.retryable
                    observation = None
                break
        else:
            try:
                observation = self._observe(target)
                converged = not self._plan(target, observation, prune)
            except _AbortPass as exc:
                errors.append(f"observe: {exc.error.reference}: {exc.error}")
                retry = True
        if converged and self.stops_under_way():
            converged = False  # a VM is still being stopped: not there yet
        if converged and not failed and desired is not None and not self.fenced:
            self._generation_applied = desired.generation
        wanted = {v.name for v in target.vms}
        removed = sorted({a.vm for a in applied if isinstance(a, Undefine) and self._orphan(a.vm, wanted)})
        if removed:
            log.warning("removed orphan VM(s) (no desired state wants them): %s", ", ".join(removed))
        observed = self._report(target, observation, errors, prune, removed)
        if observation is not None:
            self._owned &= wanted | set(observation.vms)
        if observed is None and self.reporter is not None:
            retry = True
        if switched:
            took = time.perf_counter() - t_switch
            self.row_switches += 1
            self.switch_seconds = [*self.switch_seconds[-(SWITCH_KEEP - 1):], took]
            if self.on_switch is not None:
                self.on_switch(took)
        if retry:
            delay = self.backoff.next_delay()
        else:
            self.backoff.reset()
            delay = self.resync_seconds
        if to_switch is not None:  # wake at the next slice boundary (in real seconds: the clock may be sped up)
            delay = min(delay, to_switch / float(getattr(self.clock, "factor", 1.0)) + SWITCH_SLACK_S)
        return ReconcileResult(generation=desired.generation if desired is not None else None,
                               applied=tuple(applied), errors=tuple(errors), retry=retry, converged=converged,
                               delay=delay, observed=observed, failed=tuple(failed))

    def _fetch(self, errors: list[str]) -> tuple[NodeDesired | None, bool, bool]:
        """The desired state to work toward, whether to prune VMs it does not list, and whether the
        fetch failed in a way worth retrying soon. On any error the last valid state is kept."""
        try:
            fresh = self.source.fetch()
        except VmctlError as exc:
            errors.append(f"desired: {exc.reference}: {exc}")
            log.warning("cannot fetch desired state: %s", exc)
            return self._desired, self._desired is not None, exc.retryable
        if fresh is None:
            if not self._relayout_waits or self._raw is None:
                return self._desired, self._desired is not None, False
            fresh = self._raw  # a new layout waits for the host's job VMs to leave: look again
        self._raw = fresh
        before = self.layout
        self._follow_layout(fresh, errors)
        try:
            full, refused = accept(self.layout.complete(fresh), self.layout, self.peers, self.checkpoint_peers)
        except VmctlError as exc:
            if self.layout is not before:  # a document its own layout does not validate: keep the host as it was
                log.warning("back to %s %s: generation %d does not fit the layout it names", before.levels,
                            before.discipline.value, fresh.generation)
                self.layout, self.active_row = before, 0
                self.relayouts -= 1
            errors.append(f"desired: {exc.reference}: {exc}")
            log.warning("rejected desired state generation %d: %s", fresh.generation, exc)
            return self._desired, self._desired is not None, False
        for r in set(refused) - set(self._refused):
            log.warning("refused migration %s of %s to %s (generation %d; the rest is applied): %s",
                        r.migration_id, r.vm, r.target_node, fresh.generation, r.reason)
        self._desired, self._refused = full, refused
        return full, True, False

    # ------------------------------------------------------------------ the layout vmctld asks for

    def _follow_layout(self, desired: NodeDesired, errors: list[str]) -> None:
        """Take the layout ``desired`` names (``NodeDesired.layout``; none: keep the one there is) once the
        host holds no job VM that ``desired`` does not list: VMs it lists were placed in that layout (vmctld
        changes a node's layout only while no job holds it), others are pruned first. The old layout's
        placeholders then go and the new one's are created by the plan, as for any change of desired state.
        A layout the host's memory cannot hold (or the config cannot carry) is refused and reported in
        ``errors`` every cycle; the host keeps its layout."""
        want = self._layout_for(desired, errors)
        if want is None:
            self._relayout_waits = False
            return
        held = self._unlisted_job_vms(desired)
        if held:
            if not self._relayout_waits:
                log.info("layout %s waits for the job VMs %s to leave %s", NodeLayout(want.discipline, want.levels)
                         .text(), ", ".join(held[:5]), self.layout.host)
            self._relayout_waits = True
            return
        old = NodeLayout(self.layout.discipline, self.layout.levels)
        self.layout = want
        self.active_row = 0
        self.relayouts += 1
        self._relayout_waits = False
        log.warning("host %s re-laid out on vmctld's word: %s -> %s", want.host, old.text(),
                    NodeLayout(want.discipline, want.levels).text())

    def _retake_layout(self, errors: list[str]) -> bool:
        """Within a cycle: take the layout that waited for job VMs to leave, if they have (the plan's
        previous pass pruned them); True when the host was re-laid out."""
        raw = self._raw
        if raw is None:
            return False
        before = self.layout
        self._follow_layout(raw, errors)
        if self.layout is before:
            return False
        try:
            self._desired, self._refused = accept(self.layout.complete(raw), self.layout, self.peers,
                                                  self.checkpoint_peers)
        except VmctlError as exc:
            errors.append(f"desired: {exc.reference}: {exc}")
            log.warning("rejected desired state generation %d: %s", raw.generation, exc)
        return True

    def _layout_for(self, desired: NodeDesired, errors: list[str]) -> Layout | None:
        """The ``Layout`` to take for ``desired.layout``, or None to keep the current one."""
        nl = desired.layout
        if nl is None or (nl.discipline, nl.levels) == (self.layout.discipline, self.layout.levels):
            return None
        memory = self.host_memory_mib
        if memory is None:
            try:
                memory = self.backend.host_info().memory_mib
            except VmctlError as exc:
                errors.append(f"layout: cannot take {nl.text()} yet: {exc}")
                return None
        problem = memory_problem(nl.levels, self.layout.size, self.layout.memory_mib, memory)
        if problem is None:
            try:
                return replace(self.base_layout, discipline=nl.discipline, levels=nl.levels, placeholders=None)
            except VmctlError as exc:
                problem = str(exc)
        errors.append(f"layout: refused {nl.text()} (keeping {self.layout.levels} {self.layout.discipline.value}): "
                      f"{problem}")
        return None

    def _unlisted_job_vms(self, desired: NodeDesired) -> list[str]:
        """vmctl VMs on the host other than this layout's placeholders that ``desired`` does not list
        (VMs of jobs that ended, to be pruned); a relist that fails counts as holding some."""
        listed = {v.name for v in desired.vms} | {v.name for v in self.layout.pair_vms()}
        try:
            vms = self.backend.list_vms()
        except VmctlError as exc:
            return [f"(unknown: {exc})"]
        return sorted(v.name for v in vms if v.name not in listed
                      and (v.metadata.get(META_MANAGED) == "1" or self.layout.is_ours(v.name, v.metadata)))

    # ------------------------------------------------------------------ observe and apply

    def _plan(self, target: NodeDesired, observation: Observed, prune: bool) -> list[Action]:
        held = self._desired.generation if self._desired is not None else None
        self.fenced = self.fence is not None and self.fence(held)
        if self.fenced:
            target = self._fence_target(target, observation)
            acts = plan(target, observation, self.layout, self.peers, self.migrate_uris, prune=prune,
                        transfer_checkpoints=self.transfer is not None)
            return [a for a in acts if not isinstance(a, StartProcess | StartMigration)]
        return plan(target, observation, self.layout, self.peers, self.migrate_uris, prune=prune,
                    transfer_checkpoints=self.transfer is not None)

    def _fence_target(self, target: NodeDesired, observation: Observed) -> NodeDesired:
        """The desired state while fenced: every job VM paused, nothing new started, no migration
        started or continued (a live migration in flight is aborted), nothing removed that may still
        arrive."""
        out: list[VmDesired] = []
        for v in target.vms:
            o = observation.vms.get(v.name)
            power = o.power if o is not None else PowerState.ABSENT
            m = v.migration
            if v.process is None:
                out.append(v)
            elif m is not None and m.source_node == self.layout.host and m.phase not in ("completed", "failed"):
                if power is PowerState.RUNNING:
                    out.append(replace(v, migration=None, power=PowerState.PAUSED))
                elif power is PowerState.MIGRATING and m.mode == "live":
                    out.append(replace(v, migration=replace(m, phase="aborted")))
                else:
                    out.append(v)
            elif power is PowerState.ABSENT and m is None:
                continue  # not created yet: start nothing while fenced
            else:
                out.append(replace(v, power=PowerState.PAUSED) if v.power is PowerState.RUNNING else v)
        return replace(target, vms=tuple(out))

    def fence_vms(self) -> list[str]:
        """Pause every running job VM of the last desired state now (from the fence watch thread, so a
        reconcile cycle stuck in a slow call does not hold the fence up); returns their names."""
        desired = self._desired
        if desired is None:
            return []
        jobs = {v.name for v in desired.vms if v.process is not None}
        paused: list[str] = []
        try:
            vms = self.backend.list_vms()
        except VmctlError as exc:
            log.error("fence: cannot list the VMs: %s", exc)
            return paused
        for vm in vms:
            if vm.name in jobs and vm.power is PowerState.RUNNING:
                try:
                    self.backend.suspend(vm.name)
                    paused.append(vm.name)
                except VmctlError as exc:
                    log.error("fence: cannot pause %s: %s", vm.name, exc)
        if paused:
            log.warning("fenced: paused %s", ", ".join(paused))
        return paused

    def _observe(self, desired: NodeDesired) -> Observed:
        try:
            vms = self.backend.list_vms()
        except VmctlError as exc:
            raise _AbortPass(exc) from exc
        by_name = {v.name: v for v in vms}
        processes: dict[str, ProcessStatus | None] = {}
        migrations: dict[str, MigrationStatus] = {}
        files: set[str] = set()
        for d in desired.vms:
            o = by_name.get(d.name)
            if self.runner is not None and o is not None and o.power is PowerState.RUNNING:
                try:
                    processes[d.name] = self.runner.status(d.name)
                except VmNotFound:
                    pass
                except VmctlError as exc:  # unknown process state: never guess (it could double-start a job)
                    raise _AbortPass(exc) from exc
            if d.migration is not None and d.migration.source_node == self.layout.host and o is not None:
                try:
                    migrations[d.name] = self.backend.migration_status(d.name)
                except (VmStateError, VmNotFound, OperationNotSupported):
                    pass
                except VmctlError as exc:
                    raise _AbortPass(exc) from exc
            if d.checkpoint_path and os.path.exists(d.checkpoint_path):
                files.add(d.checkpoint_path)
        wanted = {d.name for d in desired.vms}
        for o in vms:  # one of ours leaving for a host no desired state puts it on (the plan calls it back)
            if o.power is PowerState.MIGRATING and o.name not in wanted and self.layout.is_ours(o.name, o.metadata):
                try:
                    migrations[o.name] = self.backend.migration_status(o.name)
                except (VmStateError, VmNotFound, OperationNotSupported):
                    pass
                except VmctlError as exc:
                    raise _AbortPass(exc) from exc
        self._sample(vms)
        self._note_starts(processes, by_name)
        return Observed(by_name, processes, migrations, frozenset(files), frozenset(self._transferred),
                        self.stops_under_way())

    def _note_starts(self, processes: Mapping[str, ProcessStatus | None], vms: Collection[str]) -> None:
        """Record when each job process was first seen started (module docstring); forget processes gone."""
        now = self.clock.now()
        factor = float(getattr(self.clock, "factor", 1.0))
        keep: set[tuple[str, str, int]] = set()
        for vm, st in processes.items():
            if st is None or not st.started:
                continue
            key = (vm, st.job_id, st.index)
            keep.add(key)
            if key not in self._proc_started:
                ago = st.started_ago_s if st.started_ago_s is not None else 0.0
                self._proc_started[key] = now - max(0.0, ago) * factor
        for key in set(self._proc_started) - keep:
            if key[0] in processes or key[0] not in vms:  # seen without that process, or the VM is gone
                del self._proc_started[key]

    # ------------------------------------------------------------------ stops off the pass

    def stops_under_way(self) -> frozenset[str]:
        """The VMs whose forced stop runs now (off the reconcile pass)."""
        with self._stops_lock:
            return frozenset(self._stops)

    def _stop_off_pass(self, vm: str) -> None:
        """Start the forced stop of ``vm`` on a thread of its own (none when one is under way already)."""
        with self._stops_lock:
            if vm in self._stops:
                return
            t = threading.Thread(target=self._stop_body, args=(vm,), name=f"vmctl-stop-{vm}", daemon=True)
            self._stops[vm] = t
        log.info("stopping %s off the reconcile pass", vm)
        t.start()

    def _stop_body(self, vm: str) -> None:
        t0 = time.perf_counter()
        failure: VmctlError | None = None
        try:
            self.backend.stop(vm, force=True)
        except VmctlError as exc:
            failure = exc
        except Exception as exc:  # a bug must still end the stop's record (and be reported)
            log.exception("stop of %s failed unexpectedly", vm)
            failure = HypervisorError(backend=self.backend.name, operation="stop", problem=repr(exc))
        took = time.perf_counter() - t0
        if failure is None:
            log.info("stopped %s in %.2f s", vm, took)
        else:
            log.warning("stop %s failed after %.2f s: %s", vm, took, failure)
        with self._stops_lock:
            self._stops.pop(vm, None)
            if failure is not None:
                self._stop_failures.append((vm, failure))
        self.wake()

    def wait_stops(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the stops under way to end (an agent shutting down);
        True when none is left."""
        deadline = time.monotonic() + timeout
        while True:
            with self._stops_lock:
                threads = list(self._stops.values())
            if not threads:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            threads[0].join(timeout=left)

    def _sample(self, vms: list[VmInfo]) -> None:
        now = self.clock.now()
        seen = set()
        for v in vms:
            seen.add(v.name)
            prev = self._samples.get(v.name)
            if prev is not None:
                dt = now - prev[0]
                if dt > 1e-9:
                    du = v.cpu_time_s - prev[1]
                    self._util[v.name] = min(1.0, max(0.0, du / dt)) if v.power is PowerState.RUNNING else 0.0
                    self._samples[v.name] = (now, v.cpu_time_s)
                elif v.cpu_time_s < prev[1]:  # restarted guest: counter reset
                    self._samples[v.name] = (now, v.cpu_time_s)
            else:
                self._samples[v.name] = (now, v.cpu_time_s)
                self._util.setdefault(v.name, 0.0)
        for gone in set(self._samples) - seen:
            del self._samples[gone]
            self._util.pop(gone, None)

    def _apply(self, act: Action) -> None:
        b = self.backend
        log.info("apply %s", act)
        if isinstance(act, Define):
            if act.problem is not None:  # the plan could not give it what it needs (a forwarded SSH port)
                raise HypervisorError(backend=f"agent {self.layout.host}", operation="define",
                                      problem=act.problem)
            b.define(act.spec)
        elif isinstance(act, Undefine):
            b.undefine(act.vm)
        elif isinstance(act, Start):
            b.start(act.vm)
            if isinstance(self.runner, BootAware):
                self.runner.booted(act.vm)
        elif isinstance(act, Stop):
            b.stop(act.vm, force=True)
        elif isinstance(act, Suspend):
            b.suspend(act.vm)
        elif isinstance(act, Resume):
            b.resume(act.vm)
        elif isinstance(act, Pin):
            b.pin_vcpus(act.vm, act.cores)
        elif isinstance(act, Tune):
            b.set_cpu_tune(act.vm, weight=act.weight, cap=act.cap, clear_cap=act.clear_cap)
        elif isinstance(act, CheckpointVm):
            b.checkpoint(act.vm, act.path)
        elif isinstance(act, RestoreVm):
            got = b.restore(act.path)
            if got != act.vm:
                raise HypervisorError(backend=b.name, operation="restore",
                                      problem=f"{act.path} holds VM {got!r}, expected {act.vm!r}")
            if act.metadata:  # a checkpoint made on another node names that node: this one owns it now
                b.set_metadata(got, dict(act.metadata))
        elif isinstance(act, Claim):
            b.set_metadata(act.vm, dict(act.metadata))
        elif isinstance(act, StartMigration):
            b.start_migration(act.vm, act.dest_uri, act.migrate_uri,
                              metadata={META_NODE: act.node} if act.node else None)
        elif isinstance(act, AbortMigration):
            b.abort_migration(act.vm)
        elif isinstance(act, TransferCheckpoint):
            if self.transfer is None:
                raise OperationNotSupported(backend=f"agent {self.layout.host}", operation="checkpoint transfer")
            self.transfer(act.path, act.node, act.path)
            self._transferred.add(act.path)
        elif isinstance(act, StartProcess | KillProcess):
            if self.runner is None:
                raise OperationNotSupported(backend=f"agent {self.layout.host} (no process runner configured)",
                                            operation=act.kind)
            if isinstance(act, StartProcess):
                self.runner.start(act.vm, act.spec)
            else:
                self.runner.kill(act.vm)
        else:  # pragma: no cover - exhaustive over Action
            raise TypeError(f"unknown action {act!r}")

    # ------------------------------------------------------------------ report

    def _report(self, desired: NodeDesired, obs: Observed | None, errors: list[str], prune: bool = False,
                removed: Collection[str] = ()) -> NodeObserved | None:
        now = self.clock.now()
        if obs is not None:
            self._last_vms = self._observed_vms(desired, obs, prune, removed)
        host_util = 0.0
        running = [v.utilization for v in self._last_vms if v.power is PowerState.RUNNING]
        if running:
            host_util = min(1.0, sum(running) / max(1, self.layout.size))
        errors.extend(f"migration {r.migration_id} of {r.vm} to {r.target_node} refused: {r.reason}"
                      for r in self._refused)
        observed = NodeObserved(node=self.layout.host, generation_applied=self._generation_applied,
                                cores=self.layout.size, vms=self._last_vms, host_utilization=host_util,
                                errors=tuple(errors), time=now, refusals=self._refused,
                                layout=NodeLayout(self.layout.discipline, self.layout.levels),
                                layout_memory_mib=self.layout.memory_mib)
        if self.reporter is None:
            return observed
        try:
            self.reporter.report(observed)
        except VmctlError as exc:
            errors.append(f"report: {exc.reference}: {exc}")
            log.warning("cannot report: %s", exc)
            return None
        return observed

    def _observed_vms(self, desired: NodeDesired, obs: Observed, prune: bool = False,
                      removed: Collection[str] = ()) -> tuple[VmObserved, ...]:
        """Every VM of desired state and every other VM of ours on the host. One of ours that desired state
        does not list is an ``orphan`` (once a desired state was received: before that nothing is known to
        be unwanted; placeholders aside) while it is still here: a run's VMs normally go in the cycle that
        learns the run ended, so a reported orphan is one whose removal failed or waits (migrating). An
        orphan that no desired state this agent held put here (``_orphan``: it arrived after its job
        ended, or is from before a restart) and that this cycle removed is reported once more, absent, so
        that vmctld hears of it."""
        wanted = {d.name: d for d in desired.vms}
        out: list[VmObserved] = []
        for name in sorted(set(removed) - set(obs.vms) - set(wanted)):
            out.append(VmObserved(name=name, power=PowerState.ABSENT, orphan=True))
        for name, v in sorted(obs.vms.items()):
            d = wanted.get(name)
            if d is None and not self.layout.is_ours(name, v.metadata):
                continue
            core = self.layout.local(v.pinned_cores[0]) if v.pinned_cores else None
            proc = obs.processes.get(name)
            phase = None
            if d is not None and d.migration is not None:
                st = obs.migrations.get(name)
                if d.migration.source_node == self.layout.host:
                    phase = st.state.value if st is not None else None
                    if st is None and v.power in (PowerState.SAVED, PowerState.SHUTOFF) \
                            and d.migration.mode == "checkpoint" and d.checkpoint_path in obs.files:
                        copied = self.transfer is None or d.checkpoint_path in self._transferred
                        phase = "checkpointed" if copied else "saved"
                else:
                    phase = "arrived"
            out.append(VmObserved(
                name=name, power=v.power, core=core, weight=v.weight, cap=v.cap, cpu_time_s=v.cpu_time_s,
                utilization=self._util.get(name, 0.0) if v.power is PowerState.RUNNING else 0.0,
                process_job=proc.job_id if proc is not None else None,
                process_index=proc.index if proc is not None else None,
                process_exit=proc.exit_code if proc is not None else None, migration_phase=phase,
                process_starting=proc is not None and not proc.started,
                stopping=name in obs.stopping,
                process_started_at=self._proc_started.get((name, proc.job_id, proc.index)) if proc is not None
                else None,
                orphan=prune and d is None and not self.layout.is_level_name(name)))
        for name, d in sorted(wanted.items()):
            if name in obs.vms:
                continue
            phase = None
            if d.migration is not None:
                phase = "completed" if d.migration.source_node == self.layout.host else "waiting"
            out.append(VmObserved(name=name, power=PowerState.ABSENT, migration_phase=phase))
        return tuple(out)

    def _orphan(self, name: str, wanted: Collection[str]) -> bool:
        """A VM of ours that no desired state wants and that no desired state this agent held put here (a
        placeholder that gives way to a job VM is none)."""
        return name not in wanted and name not in self._owned and not self.layout.is_level_name(name)

    # ------------------------------------------------------------------ the loop

    def run(self, stop: threading.Event, max_cycles: int | None = None,
            on_cycle: Callable[[ReconcileResult | None, float], None] | None = None,
            max_wait: float | None = None) -> None:
        """Reconcile until ``stop`` is set (waits in real seconds between cycles). ``on_cycle(result,
        seconds)`` runs after every cycle (result None when the cycle crashed); ``max_wait`` caps a
        single wait (so a watchdog keeps being fed)."""
        n = 0
        while not stop.is_set() and (max_cycles is None or n < max_cycles):
            n += 1
            t0 = time.perf_counter()
            res: ReconcileResult | None = None
            try:
                res = self.run_once()
                delay = res.delay
            except Exception:  # a bug must not kill the agent: log it and back off
                log.exception("reconcile cycle failed unexpectedly")
                delay = self.backoff.next_delay()
            if on_cycle is not None:
                on_cycle(res, time.perf_counter() - t0)
            if max_cycles is not None and n >= max_cycles:
                break
            if not math.isfinite(delay):
                delay = self.resync_seconds
            if max_wait is not None:
                delay = min(delay, max_wait)
            self._wake.wait(timeout=max(0.0, delay))
            self._wake.clear()
