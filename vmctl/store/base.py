"""The state store of vmctld: records and the ``Store`` protocol.

The daemon keeps its whole working state in memory and writes every change through to a real
database, in one transaction per event (``Store.write(epoch, batch)``), so that a ``kill -9`` at any
point leaves the database at the end of some complete event. Every write checks the leader epoch
inside the transaction: a daemon whose lease was taken over cannot change anything (``LeaseLost``).

Records are stored as a JSON document plus the few columns that are queried (ids, state); a task bag's
results are rows of their own and its dispatcher state a column (schema 006, ``vmctl.store.tasks``). Two
backends implement the protocol with the same SQL (``vmctl.store.sql``): SQLite (default, WAL) and
PostgreSQL (psycopg 3).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from operator import attrgetter
from typing import Any, Protocol

from vmctl.errors import StoreError
from vmctl.model import DEFAULT_NODE_GROUP, DEFAULT_NODE_SPEED, Job, JobState


class CorruptRecord(StoreError):
    """A stored row that cannot be read back (invalid JSON, missing or wrong fields)."""

    reference = "store-corrupt"
    retryable = False
    http_status = 400  # vmctld exits 2: the operator must repair or restore the store
    template = "{backend}: {where}: table {table}, row {row}: {problem}"


class StoreDamaged(StoreError):
    """The database itself is damaged (SQLite: ``database disk image is malformed``, a page that is not a
    database page; PostgreSQL: ``data_corrupted``/``index_corrupted``). Not retryable: vmctld refuses to
    start on it, and a running leader gives up its lease and answers 503 instead of serving 500s."""

    reference = "store-damaged"
    retryable = False
    http_status = 503
    template = "{backend}: {where}: the database is damaged: {problem}"
    hint = ("restore a backup: stop vmctld, `vmctld restore FILE --config CONFIG` (docs/operations.md, \"State, "
            "backup and restore\"); without one, `sqlite3 DB .recover` salvages what is readable into a new file "
            "to restore from")


@dataclass(frozen=True, slots=True)
class StorePosition:
    """How far a store's history goes: ``timeline`` (1, then one more at every deliberate rollback: a
    ``vmctld restore``, an accepted rollback) and ``commits`` (the leader's committed transactions on
    it), with the newest job and event numbers written so far (for messages about what is missing).
    Schema 007 keeps the first two in the lease row; the state directory keeps the highest position it
    saw (``vmctl.daemon.statedir.HighWater``)."""

    timeline: int
    commits: int
    job: int = 0
    event: int = 0

    def older_than(self, seen: StorePosition) -> bool:
        """This store lacks commits a state directory saw at ``seen``: the same timeline with fewer
        commits, or an earlier timeline (a later one is a deliberate rollback made since)."""
        return self.timeline < seen.timeline or (self.timeline == seen.timeline and self.commits < seen.commits)


class LeaseHeld(StoreError):
    """An offline store operation refused while a running daemon holds the leader lease."""

    reference = "lease-held"
    retryable = False
    http_status = 409
    template = ("{path}: a running vmctld ({holder}) holds the leader lease for {seconds:.0f} s more: stop it "
                "first (a daemon killed with SIGKILL frees the lease when it expires)")

# --------------------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one process of a job runs: VM level ``level`` of local core ``core`` of node ``node``.

    ``core`` None: an unpinned, capped VM of a shared (vcsched) cluster, which holds no (core, level)
    slot of the priority or timeslice layouts but its node's CPU as a whole; its ``level`` is 0 (the view
    counts a shared VM as fg). On the wire (``VmDesired.core``, a migration's moves) such a VM's core is
    -1 (``wire_core``): the record states it, the documents keep their format."""

    node: str
    core: int | None
    level: int

    @property
    def wire_core(self) -> int:
        """The core as desired documents and migration moves carry it (-1: unpinned)."""
        return -1 if self.core is None else self.core

    @property
    def shared(self) -> bool:
        return self.core is None

    def to_json(self) -> list[Any]:
        return [self.node, self.core, self.level]

    @classmethod
    def from_json(cls, raw: Any) -> Slot:
        node, core, level = raw
        return cls(str(node), None if core is None else int(core), int(level))


def slots_at(places: Sequence[tuple[str, int]], level: int, shared: bool = False) -> list[Slot]:
    """Slots on ``level`` of ``places`` ((node, local core) pairs); ``shared``: unpinned VMs on the nodes."""
    return [Slot(n, None if shared else c, level) for n, c in places]


def upgrade_job_doc(d: dict[str, Any]) -> dict[str, Any]:
    """A job document stored before placement became slots (schema < 008: ``tier``, ``placement``, a gang
    job's ``level``, a task bag's per-worker ``levels`` in its ``bag``) in the new form (a copy); a
    document of the new form as it is. The level of each slot: a gang job's row, a bag worker's level,
    else 0 for fg and shared (cores -1 then: unpinned) and 1 for bg."""
    if "slots" in d:
        return d
    d = dict(d)
    tier = d.pop("tier", None)
    placement = [(str(n), int(c)) for n, c in d.pop("placement", None) or []]
    level = d.pop("level", None)
    levels = [int(level) if level is not None else 1 if tier == "bg" else 0] * len(placement)
    bag = d.get("bag")
    if isinstance(bag, dict):
        bag, bag_levels = split_bag_levels(bag, len(placement))
        d["bag"] = bag
        levels = bag_levels if bag_levels is not None else levels
    d["slots"] = [Slot(n, None if tier == "shared" else c, lv).to_json()
                  for (n, c), lv in zip(placement, levels, strict=True)]
    d["gang"] = level is not None
    return d


def split_bag_levels(bag: dict[str, Any], workers: int) -> tuple[dict[str, Any], list[int] | None]:
    """A bag's dispatcher state without the per-worker ``levels`` (or the single ``level`` of the form
    before that) stored before schema 008 (a copy), and those levels (None: it had none)."""
    if "levels" not in bag and "level" not in bag:
        return bag, None
    bag = dict(bag)
    levels = bag.pop("levels", None)
    level = bag.pop("level", None)
    if levels is None:
        levels = [int(level or 0)] * workers
    return bag, [int(lv) for lv in levels]


@dataclass(slots=True)
class JobRecord:
    """Everything the daemon knows about one job. ``run`` counts the starts of the job (a kill with
    requeue starts a new run); VM names carry it, so a report about an old run is never taken for the
    current one. ``slots[i]`` is where process i (a task bag's worker i) runs while it holds slots: the
    one statement of the job's placement, from which the tier, a gang job's row and the bag's worker
    levels are read (``tier``, ``level``, ``placement``)."""

    id: str
    seq: int
    name: str
    spec: dict[str, Any]
    state: JobState
    submit_time: float
    start_time: float | None = None
    end_time: float | None = None
    slots: list[Slot] = field(default_factory=list)
    reason: str | None = None
    tasks: list[dict[str, Any]] = field(default_factory=list)
    migrations: int = 0
    run: int = 0
    progress_base: float = 0.0  # dedicated-core work done before tier_since
    tier_since: float | None = None
    suspended: bool = False
    checkpointed: bool = False  # VMs saved to files, slots free
    cap: float | None = None
    weight: int | None = None  # operator override of the VM weight
    migrating: str | None = None  # id of the open migration operation
    cancel_requested: bool = False
    restore_pending: bool = False  # VMs to be restored from their checkpoint files
    #: held by an operator (``vmctl job hold``): queued, but out of the queue the policy sees until released
    held: bool = False
    #: what happened to the job (starts, tier changes, migrations, requeues, its end), oldest first and
    #: bounded (vmctl.daemon.history); absent from jobs stored before it was kept: empty
    history: list[dict[str, Any]] = field(default_factory=list)
    #: a running task bag's workers (``vmctl.daemon.dispatcher``: stable worker numbers, the task each
    #: runs, the workers given up at their task boundary, observed throughput); None for other jobs
    bag: dict[str, Any] | None = None
    #: timeslice clusters (gang scheduling): the job runs in rows (its slots' level is its row), the other
    #: rows it is replicated into (same cores), and when it last changed nodes (the policies' quota Q per
    #: slice); False / empty / None for jobs of the other disciplines
    gang: bool = False
    replicas: list[int] = field(default_factory=list)
    migrated_at: float | None = None
    #: why the policy started the current run at this width and place (``Start.reason``), None when it
    #: gave no reason (absent from jobs stored before it was kept)
    width_reason: str | None = None
    #: the estimate's own account (``ClusterState.estimate_progress``): progress counted against the
    #: estimate before ``tier_since`` (fg time on the job's cores, bg stints by the CPU time the agents
    #: reported; never modelled bg progress), and the job's CPU progress when the current stint began
    #: (None: no report at hand then). ``est_base`` None: stored before it was kept (the model counts)
    est_base: float | None = None
    cpu_mark: float | None = None
    #: a task bag: the tasks whose entry of ``tasks`` changed since the record was last stored (kept by the
    #: dispatcher; the store writes their rows, schema 006, and empties it). Not part of the document
    changed_tasks: set[int] = field(default_factory=set, compare=False, repr=False)

    def to_doc(self) -> dict[str, Any]:
        """The stored document: the fields without a default, ``slots`` (always: it tells this form from the
        one before schema 008, ``upgrade_job_doc``) and only those other fields whose value differs from
        their default (``from_doc`` gives the default back). A job just submitted is 8 keys instead of 30:
        its encoding was the largest cost of a batched submission (issue 27)."""
        # by hand: dataclasses.asdict deep-copies and is ~20x slower on the hot path
        d = dict(zip(_JOB_REQUIRED, _GET_REQUIRED(self), strict=True))
        for f, v, dflt in zip(_JOB_OPTIONAL, _GET_OPTIONAL(self), _JOB_DEFAULTS, strict=True):
            if v is not dflt and (v != dflt or type(v) is not type(dflt)):
                d[f] = v
        d["slots"] = [s.to_json() for s in self.slots]
        d["state"] = str(self.state)  # a plain str: the encoder takes ~4 us longer over an enum member
        return d

    @classmethod
    def from_doc(cls, d: dict[str, Any]) -> JobRecord:
        d = dict(upgrade_job_doc(d))
        d["slots"] = [Slot.from_json(s) for s in d.get("slots", [])]
        d["state"] = JobState(d["state"])
        return cls(**d)

    def adopt_bag(self, bag: dict[str, Any]) -> None:
        """Put a task bag's dispatcher state (its store column) into the record; one stored before schema 008
        brings its workers' levels, which go to the slots."""
        bag, levels = split_bag_levels(bag, len(self.slots))
        if levels is not None and len(levels) == len(self.slots):
            self.slots = [Slot(s.node, s.core, lv) for s, lv in zip(self.slots, levels, strict=True)]
        self.bag = bag

    # ---------------------------------------------------------------- what the slots say
    @property
    def placement(self) -> list[tuple[str, int]]:
        """(node, local core) of each process, in wire form (-1: an unpinned shared VM)."""
        return [(s.node, s.wire_core) for s in self.slots]

    @property
    def shared(self) -> bool:
        """A shared (vcsched) job: its VMs are unpinned."""
        return bool(self.slots) and self.slots[0].core is None

    @property
    def holds_fg(self) -> bool:
        """A pinned job with a slot on level 0 (a fg job, a task bag with a fg worker, a gang job in row 0)."""
        return not self.shared and self.lowest_level == 0

    @property
    def lowest_level(self) -> int | None:
        return min(map(_LEVEL, self.slots), default=None)

    @property
    def tier(self) -> str | None:
        """The priority name documents and the CLI show: ``shared`` for unpinned VMs, else ``fg`` when a
        slot is on level 0, ``bg`` otherwise; None while the job holds no slot."""
        if not self.slots:
            return None
        if self.shared:
            return "shared"
        return "fg" if self.lowest_level == 0 else "bg"

    @property
    def level(self) -> int | None:
        """A gang job's row (None: not a gang job, or placed nowhere)."""
        return self.slots[0].level if self.gang and self.slots else None

    def set_level(self, level: int) -> None:
        """Every slot on ``level`` (a tier change, a gang job's row change)."""
        self.slots = [Slot(s.node, s.core, level) for s in self.slots]

    def to_job(self) -> Job:
        s = self.spec
        usage = s.get("cpu_usage")
        return Job(
            id=self.id,
            submit_time=self.submit_time,
            procs=int(s["procs"]),
            estimate=float(s["estimate"]),
            cpu_usage=tuple(usage) if usage is not None else None,
            priority=int(s.get("priority", 0)),
            deadline=s.get("deadline"),
            user=str(s.get("user", "")),
            mem=float(s.get("mem", 0.0)),
            cpu_need=float(s.get("cpu_need", 1.0)),
        )

    def vm_name(self, index: int) -> str:
        """The VM of process ``index`` (a task bag's worker ``index`` of ``placement``: its VM keeps
        the worker's stable number while other workers come and go)."""
        if self.bag is not None:
            index = int(self.bag["vms"][index])
        return f"j{self.id}-r{self.run}-p{index}"


_LEVEL = attrgetter("level")
_JOB_FIELDS: tuple[str, ...] = tuple(f for f in JobRecord.__dataclass_fields__ if f != "changed_tasks")


def _field_default(f: Any) -> Any:
    return f.default_factory() if f.default is MISSING else f.default


_FIELDS = {f.name: f for f in fields(JobRecord)}
#: the fields every stored document has, and the others with their defaults (left out when at them)
_JOB_REQUIRED: tuple[str, ...] = tuple(f for f in _JOB_FIELDS if _FIELDS[f].default is MISSING
                                       and _FIELDS[f].default_factory is MISSING)
_JOB_OPTIONAL: tuple[str, ...] = tuple(f for f in _JOB_FIELDS if f not in _JOB_REQUIRED and f != "slots")
_JOB_DEFAULTS: tuple[Any, ...] = tuple(_field_default(_FIELDS[f]) for f in _JOB_OPTIONAL)
_GET_REQUIRED = attrgetter(*_JOB_REQUIRED)
_GET_OPTIONAL = attrgetter(*_JOB_OPTIONAL)


@dataclass(slots=True)
class NodeRecord:
    name: str
    cores: int
    state: str = "ready"  # ready | draining | drained | lost
    last_seen: float = 0.0
    generation: int = 0
    hostname: str = ""
    backend: str = ""
    registered: float = 0.0
    observed: dict[str, Any] | None = None  # last NodeObserved, wire form
    # the nodes this node's agent can migrate to, as it registered them: ``peers`` for live migration
    # (None = the agent did not say: not restricted), ``checkpoint_peers`` for checkpoint migration
    # over sftp (None = shared checkpoint storage: any node)
    peers: list[str] | None = None
    checkpoint_peers: list[str] | None = None
    # what the agent registered about its host: core speed relative to a standard core, the group
    # (cluster or partition) and the memory in MiB (0 = not known). Stored in columns of their own
    # (schema 003, ``NODE_COLUMNS``), not in the document.
    speed: float = DEFAULT_NODE_SPEED
    group: str = DEFAULT_NODE_GROUP
    memory_mib: int = 0
    # the VM level layout its agent registered: levels per core and their discipline (schema 004, columns
    # too); the defaults are the MEASY fg/bg pair every agent had before levels were registered
    levels: int = 2
    discipline: str = "priority"
    #: why an operator drained the node (``vmctl node drain --reason``); None when not given or undrained
    drain_reason: str | None = None
    #: a core count its agent registered that differs from ``cores`` and that no operator confirmed yet
    #: (the registration was refused); and the core count an operator confirmed ahead of the agent
    #: (``vmctl node cores``; used by the agent's next registration with it). None: nothing pending
    cores_pending: int | None = None
    cores_confirmed: int | None = None

    def to_doc(self) -> dict[str, Any]:
        d = asdict(self)
        for key in NODE_COLUMNS:
            del d[key]
        return d

    @classmethod
    def from_doc(cls, d: dict[str, Any]) -> NodeRecord:
        return cls(**d)


#: the NodeRecord fields stored as columns of the nodes table (schemas 003, 004) instead of in its document
NODE_COLUMNS = ("speed", "group", "memory_mib", "levels", "discipline")


@dataclass(slots=True)
class OperationRecord:
    """A multi-step action the daemon follows until the agents confirm it (migration, checkpoint,
    restore, kill). ``state``: pending -> done | failed | rolled_back."""

    id: str
    kind: str
    job_id: str
    state: str
    created: float
    updated: float
    detail: dict[str, Any] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, d: dict[str, Any]) -> OperationRecord:
        return cls(**d)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One entry of the event log (schema 005): ``seq`` orders every event of the cluster, ``kind`` is
    ``job.started``, ``node.lost``, ``policy.changed``, ...; ``actor`` names who asked (``token NAME``,
    ``agent NODE``) or ``vmctld`` for what the daemon did on its own (its policy, its timers)."""

    seq: int
    time: float
    kind: str
    message: str
    job_id: str | None = None
    node: str | None = None
    actor: str = "vmctld"

    def to_doc(self) -> dict[str, Any]:
        return {"message": self.message, "job_id": self.job_id, "node": self.node, "actor": self.actor}

    @classmethod
    def from_row(cls, seq: Any, time: Any, kind: Any, doc: dict[str, Any]) -> EventRecord:
        job, node = doc.get("job_id"), doc.get("node")
        return cls(seq=int(seq), time=float(time), kind=str(kind), message=str(doc["message"]),
                   job_id=None if job is None else str(job), node=None if node is None else str(node),
                   actor=str(doc.get("actor") or "vmctld"))


@dataclass(frozen=True, slots=True)
class TokenRecord:
    hash: str
    name: str
    role: str
    created: float
    expires: float | None


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str | None
    epoch: int
    expires: float


@dataclass(slots=True)
class WriteBatch:
    """The changes of one event, written in one transaction."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    desired: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # node -> (generation, doc)
    operations: dict[str, OperationRecord] = field(default_factory=dict)
    kv: dict[str, Any] = field(default_factory=dict)
    tokens: list[TokenRecord] = field(default_factory=list)
    delete_tokens: list[str] = field(default_factory=list)
    #: nodes an operator removed (``vmctl node remove``); their desired row stays, so that a node that
    #: registers again continues its generations
    delete_nodes: list[str] = field(default_factory=list)
    #: entries of the event log recording this change (schema 005)
    events: list[EventRecord] = field(default_factory=list)
    #: task bags of which only the dispatcher state and some tasks changed (a task end): their ``bag``
    #: column and the rows of their ``changed_tasks`` are written, not their document (schema 006)
    bags: dict[str, JobRecord] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (self.jobs or self.bags or self.nodes or self.desired or self.operations or self.kv or self.tokens
                    or self.delete_tokens or self.delete_nodes or self.events)


# --------------------------------------------------------------------------------------- protocol


class Store(Protocol):
    backend: str
    #: called (outside any transaction) when the store finds its database damaged (``StoreDamaged``)
    on_damaged: Callable[[StoreDamaged], None] | None
    #: called after every committed write of the leader (``write``, ``prune_jobs``, ``prune_events``)
    #: with the store's position after it
    on_commit: Callable[[StorePosition], None] | None

    def migrate(self) -> int:
        """Create or upgrade the schema; return the schema version now in force."""
        ...

    def schema_version(self) -> int: ...

    def close(self) -> None: ...

    def position(self) -> StorePosition | None:
        """The store's position (schema 007), None while its schema is older or absent."""
        ...

    def fork_timeline(self, at_least: int, kind: str, message: str, actor: str, now: float) -> StorePosition:
        """A deliberate rollback (a restore, an accepted rollback): in one transaction, refused with
        ``LeaseHeld`` while a daemon holds the lease, the timeline becomes ``max(current, at_least) + 1``,
        the lease is left free and the event ``kind``/``message`` is logged. Returns the new position."""
        ...

    # leader lease
    def acquire_lease(self, holder: str, ttl: float, now: float) -> int | None:
        """Take (or keep) the lease; return the epoch, or None while another holder's lease runs."""
        ...

    def renew_lease(self, holder: str, epoch: int, ttl: float, now: float) -> None:
        """Extend the lease; raise ``LeaseLost`` when ``epoch`` is no longer current."""
        ...

    def release_lease(self, holder: str, epoch: int) -> None: ...

    def lease(self) -> Lease: ...

    # reads
    def load_jobs(self) -> list[JobRecord]: ...

    def load_nodes(self) -> list[NodeRecord]: ...

    def load_desired(self) -> dict[str, tuple[int, dict[str, Any]]]: ...

    def load_operations(self) -> list[OperationRecord]: ...

    def get_kv(self, key: str) -> Any: ...

    def find_token(self, token_hash: str) -> TokenRecord | None: ...

    def list_tokens(self) -> list[TokenRecord]: ...

    def location(self) -> str:
        """Where the data is, for messages (a file path; never a password)."""
        ...

    # writes
    def insert_token(self, rec: TokenRecord) -> None:
        """Add a token without the lease (offline ``vmctld token create``; tokens are read per request)."""
        ...

    def write(self, epoch: int, batch: WriteBatch) -> None:
        """Apply ``batch`` atomically if ``epoch`` is still the lease epoch, else raise ``LeaseLost``."""
        ...

    # job retention (schema 002): finished jobs pruned from the daemon's memory
    def prune_jobs(self, epoch: int, jobs: Sequence[JobRecord], archive: bool) -> None:
        """In one transaction, if ``epoch`` is still the lease epoch (else ``LeaseLost``): delete ``jobs``
        from the live job table and, with ``archive``, store these records in the job archive."""
        ...

    def get_archived_job(self, job_id: str) -> JobRecord | None: ...

    def list_archived_jobs(self, state: str | None = None, limit: int = 1000) -> list[JobRecord]:
        """Archived jobs, newest submission first, optionally only those in ``state``."""
        ...

    def count_archived_jobs(self) -> int: ...

    # the event log (schema 005)
    def list_events(self, after: int = 0, since: float | None = None, limit: int = 1000,
                    newest: bool = False) -> list[EventRecord]:
        """Events with ``seq > after`` and ``time >= since``, in order (oldest first): the first ``limit``
        of them, or with ``newest`` the last ``limit``."""
        ...

    def event_bounds(self) -> tuple[int, float | None]:
        """The highest event ``seq`` stored (0: none) and the time of the oldest event (None: none)."""
        ...

    def prune_events(self, epoch: int, before: float) -> int:
        """Delete the events older than ``before`` if ``epoch`` is still the lease epoch (else
        ``LeaseLost``); return how many."""
        ...


#: one encoder for every document (``json.dumps`` with options builds a new one per call)
_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)
_ENCODE = _ENCODER.encode


def _not_json(o: Any) -> Any:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


#: the C encoder behind ``_ENCODER``, made once: ``JSONEncoder.encode`` makes a new one per call, ~1.7 us of
#: a job's ~6 us (issue 27). Same output (``test_store_dumps``); no circular-reference check (a store
#: document is a tree). None where the C accelerator is missing: ``_ENCODE`` then.
_C_ENCODE: Callable[[Any, int], Sequence[str]] | None = (
    None if json.encoder.c_make_encoder is None  # type: ignore[attr-defined]
    else json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        None, _not_json, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True))


def dumps(doc: Any) -> str:
    if _C_ENCODE is None:
        return _ENCODE(doc)
    return "".join(_C_ENCODE(doc, 0))
