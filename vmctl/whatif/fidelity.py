"""The what-if fidelity testbed: a live cluster (vmctld + ``vmctl-agent`` processes on one accelerated clock,
mock agents and optionally one real-libvirt host) runs a seeded workload under a family's policy, its
history is exported as ``vmctl history export`` does, replayed under the same policy
(:func:`vmctl.whatif.replay.replay`) and compared with the live run (:func:`vmctl.whatif.replay.error`).
``bench/whatif.py`` runs it for every family and prints the errors; tests run a tiny version
(tests/integration/test_whatif_libvirt.py). The families, workloads and the tolerance stated for the
per-job starts are documented in bench/whatif.py and docs/operations.md ("How far to trust it").
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FAMILIES = ("measy", "vcsched", "gang", "moldable", "taskbag")
#: more families a run may name: gang scheduling without migrations (gs)
EXTRA = ("gang-gs",)


@dataclass(frozen=True, slots=True)
class Family:
    policy: str
    params: dict[str, Any]
    hosts: int
    cores: int
    layout: dict[str, Any]
    #: (rng, index) -> (arrival gap in model seconds, job spec without times)
    job: Callable[[np.random.Generator, int], tuple[float, dict[str, Any]]]
    #: the job spec's deadline is relative to its submit (made absolute at submission)
    deadline_relative: bool = False
    #: why the family has no real-libvirt variant (None: it has one, ``--libvirt-hosts``)
    no_libvirt: str | None = None
    #: what a real guest's job process does (:func:`guest_spec`): ``sleep`` its work (the workload's CPU
    #: usage made :data:`SLEEPING`), or ``spin``: consume its work x usage of its own CPU time
    #: (:func:`spin_command`), so that a cap, a paused row or a moldable width changes its run as the model's
    guest: str = "sleep"


def _rigid(rng: np.random.Generator, i: int, max_procs: int = 4, usage: bool = True) -> tuple[float, dict[str, Any]]:
    procs = int(rng.choice([1, 1, 2, 2, 3, 4][: 6 if max_procs >= 4 else 4]))
    work = float(rng.uniform(200, 1200))
    spec: dict[str, Any] = {"name": f"r{i}", "procs": procs, "work_seconds": round(work, 1),
                            "estimate": round(work * float(rng.uniform(1.2, 3.0)), 1)}
    if usage:
        spec["cpu_usage"] = [round(float(rng.uniform(0.3, 1.0)), 2)] * procs
    return float(rng.exponential(160.0)), spec


def _vc(rng: np.random.Generator, i: int) -> tuple[float, dict[str, Any]]:
    gap, spec = _rigid(rng, i, max_procs=3, usage=False)
    spec["procs"] = min(spec["procs"], 3)
    spec["cpu_need"] = round(float(rng.uniform(0.2, 1.0)), 2)
    spec["mem"] = round(float(rng.uniform(0.05, 0.3)), 2)
    return gap * 0.6, spec


def _moldable(rng: np.random.Generator, i: int) -> tuple[float, dict[str, Any]]:
    t1 = float(rng.uniform(300, 1500))
    serial = float(rng.uniform(0.05, 0.3))
    times = [round(t1 * (serial + (1 - serial) / w), 1) for w in (1, 2, 4)]
    return float(rng.exponential(180.0)), {"name": f"m{i}", "shape": {"kind": "moldable", "widths": [1, 2, 4],
                                                                        "times": times}}


def _bag(rng: np.random.Generator, i: int) -> tuple[float, dict[str, Any]]:
    n = int(rng.integers(1, 7))
    work = round(float(rng.uniform(100, 600)), 1)
    dl = round(float(rng.uniform(2, 6)) * work * n, 1)
    return float(rng.exponential(150.0)), {
        "name": f"b{i}", "shape": {"kind": "task-bag", "tasks": [work] * n, "max_workers": min(n, 4),
                                   "task_usage": 0.01},
        "priority": int(rng.integers(0, 4)), "deadline": dl}


SPECS: dict[str, Family] = {
    "measy": Family("measy", {}, 4, 2, {"levels": 2, "discipline": "priority"}, _rigid),
    # vcsched's VMs are shared (unpinned, no (core, level) slot): a real host forwards their SSH ports from the
    # layout's second range (layout.shared_ssh_ports, :func:`libvirt_agent_config`)
    "vcsched": Family("vcsched-gr", {}, 4, 2, {"levels": 1, "discipline": "shared"}, _vc, guest="spin"),
    "gang": Family("gs-m", {"mpl": 2, "slice": 100.0}, 4, 2, {"levels": 2, "discipline": "timeslice"},
                   lambda rng, i: _rigid(rng, i, usage=False), guest="spin",
                   no_libvirt="gs-m migrates between hosts, and libvirt refuses a migration to the libvirtd a VM "
                              "runs on (one libvirtd here: every real host would be the same)"),
    "gang-gs": Family("gs", {"mpl": 2, "slice": 100.0}, 4, 2, {"levels": 2, "discipline": "timeslice"},
                      lambda rng, i: _rigid(rng, i, usage=False), guest="spin"),
    "moldable": Family("moldable", {"method": "hsret"}, 4, 2, {"levels": 2, "discipline": "priority"}, _moldable,
                       guest="spin"),
    "taskbag": Family("dispatch-priority", {}, 4, 1, {"levels": 2, "discipline": "shared"}, _bag,
                      deadline_relative=True),
}


#: the forwarded SSH ports of a real host's shared VMs (layout.shared_ssh_count): more than a vcsched host holds
#: at once here (each VM asks at least 5 % of the host's memory; a VM beyond the range waits for a free port)
SHARED_SSH_PORTS = 24
#: the real-libvirt hosts' libvirtd (the system one), their guests (built and cached by vmctl.guestimage)
LIBVIRT_URI = "qemu:///system"
LIBVIRT_SOCKET = Path("/run/libvirt/libvirt-sock")
GUEST_DIR = Path("/var/cache/vmctl/guest")
#: CPU usage of a sleeping process (the guests' job processes sleep; the mock agents and the replay are told so)
SLEEPING = 0.01


def workload(fam: Family, jobs: int, seed: int, sleeping: bool = False) -> list[tuple[float, dict[str, Any]]]:
    """(arrival in model seconds from the start, spec) of each job. ``sleeping``: every process's CPU
    usage is :data:`SLEEPING` (the processes of the real-libvirt variant sleep in their guests; its
    all-mock baseline runs the same workload)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x3A7F]))
    t = 0.0
    out = []
    for i in range(jobs):
        gap, spec = fam.job(rng, i)
        if sleeping and "cpu_usage" in spec:
            spec["cpu_usage"] = [SLEEPING] * int(spec["procs"])
        out.append((t, spec))
        t += gap
    return out


def spin_command(speed: float) -> str:
    """A CPU-bound job process for a real guest (busybox ``sh``, no compiler there): it reads vmctld's model
    of itself from the environment the SSH runner gives it (``VMCTL_WORK_SECONDS``: its work in model
    seconds on a dedicated standard core -- a moldable job's time at the width HSRET chose, so the shape's
    speedup model sets it; ``VMCTL_CPU_USAGE``: its usage there, a vcsched VM's CPU need) and consumes
    ``work x usage / speed`` seconds of **its own CPU time** (utime + stime in ``/proc/$$/stat``, in
    USER_HZ = 100 ticks), then exits. On a free core it ends after ``work x usage / speed`` real seconds; a
    cap of ``c`` (vcpu_quota) stretches that to ``work x usage / (speed x c)``, a paused row stops it: the
    mock agents' and the replay's progress model. Why its own CPU time and not calibrated work: the TCG
    guest's instructions per second vary with this shared machine's load, its CPU time does not (the
    shell's loop is the only thing it measures; its 300-step inner loop keeps the reads of ``/proc`` a
    small part). Numbers with a fraction are read to 1/100 in shell integers (a leading 1 keeps ``08``
    from being octal)."""
    sc = max(1, round(speed * 100))
    return ('c() { i=${1%%.*}; f=${1#"$i"}; f=${f#.}00; f=${f%"${f#??}"}; r=$((${i:-0}*100+1$f-100)); }; '
            'c "${VMCTL_WORK_SECONDS:-0}"; w=$r; c "${VMCTL_CPU_USAGE:-1}"; '
            f't=$((w*r/{sc})); '
            'while :; do read -r l < /proc/$$/stat; set -- ${l##*") "}; '
            '[ $((${12}+${13})) -ge $t ] && exit 0; '
            'n=0; while [ $n -lt 300 ]; do n=$((n+1)); done; done')


def guest_spec(spec: dict[str, Any], speed: float, guest: str = "sleep") -> dict[str, Any]:
    """The job as the real-libvirt variant submits it. ``guest="sleep"``: each process (a bag's task) gets
    the command ``sleep w/speed`` for its w model seconds of work (a guest sleeps in real seconds; vmctld's
    clock runs ``speed`` times faster) and its ``work_seconds`` for the mock agents, which ignore the
    command. ``guest="spin"``: the job gets :func:`spin_command` as its command and keeps its model (work,
    usage, a moldable shape) as it is: each process spins the work and usage vmctld gives it."""
    out = dict(spec)
    if guest == "spin":
        out["command"] = spin_command(speed)
        return out
    shape = spec.get("shape")
    if isinstance(shape, dict) and shape.get("kind") == "task-bag":
        works = [float(w) for w in shape["tasks"]]
        usage = float(shape.get("task_usage", SLEEPING))
    else:
        works = [float(spec["work_seconds"])] * int(spec["procs"])
        usage = SLEEPING
    out["tasks"] = [{"work_seconds": w, "cpu_usage": usage, "command": f"sleep {w / speed:.3f}"} for w in works]
    return out


def libvirt_agent_config(cfg: dict[str, Any], guest_dir: Path, known_hosts: Path, cores: Sequence[int],
                         levels: int) -> dict[str, Any]:
    """An agent config on ``qemu:///system`` whose VMs boot the SSH guest (TCG) pinned to ``cores`` of this
    machine and run their job processes there over SSH; no peers (one libvirtd: no migration to it)."""
    from vmctl.localcluster import free_port_range, ssh_guest_config

    slots = levels * len(cores)
    # a shared layout's VMs (vcsched's, unpinned) have no slot: they get ports of a second range after the slots'
    shared = SHARED_SSH_PORTS if cfg.get("layout", {}).get("discipline") == "shared" else 0
    extra = ssh_guest_config(guest_dir, known_hosts, free_port_range(slots + shared), slots, shared_vms=shared)
    out = {k: v for k, v in cfg.items() if k not in ("peers", "clock")}  # real guests run in real time
    out["backend"] = {**cfg["backend"], **extra["backend"]}
    out["layout"] = {**cfg.get("layout", {}), "cores": list(cores), **extra["layout"]}
    out["ssh"] = {**extra["ssh"], "boot_timeout_seconds": 600.0}
    # a booting guest aborts the agent's passes until its SSH answers: retry soon
    out["reconcile"] = {"resync_seconds": 1.0, "backoff_initial_seconds": 0.2, "backoff_max_seconds": 0.5}
    return out


def libvirt_leftovers(nodes: set[str]) -> tuple[list[str], list[int]]:
    """The domains of ``qemu:///system`` whose metadata names one of ``nodes``, and the QEMU processes
    running one of them (what a run must not leave behind)."""
    import psutil

    from vmctl.agents.backends.libvirt.backend import LibvirtBackend
    from vmctl.agents.layout import META_NODE

    b = LibvirtBackend(LIBVIRT_URI, domain_type="qemu")
    try:
        names = sorted(v.name for v in b.list_vms() if v.metadata.get(META_NODE) in nodes)
    finally:
        b.close()
    pids = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or ())
        if "qemu" in (p.info.get("name") or "") and any(f"guest={n}," in cmd for n in names):
            pids.append(int(p.info["pid"]))
    return names, pids


def remove_libvirt_vms(nodes: set[str], settle_s: float = 3.0, timeout_s: float = 90.0) -> list[str]:
    """Destroy and undefine every domain whose metadata names one of ``nodes`` (after their agents
    stopped), until none has been seen for ``settle_s`` (libvirtd may finish a stopped agent's last
    define after it is gone); returns the names removed."""
    import contextlib

    from vmctl.agents.backends.libvirt.backend import LibvirtBackend
    from vmctl.agents.layout import META_NODE

    b = LibvirtBackend(LIBVIRT_URI, domain_type="qemu")
    removed: set[str] = set()
    try:
        deadline = time.monotonic() + timeout_s
        quiet: float | None = None
        while time.monotonic() < deadline:
            names = [v.name for v in b.list_vms() if v.metadata.get(META_NODE) in nodes]
            for n in names:
                with contextlib.suppress(Exception):
                    b.stop(n, force=True)
                with contextlib.suppress(Exception):
                    b.undefine(n)
                removed.add(n)
            now = time.monotonic()
            quiet = None if names else (quiet or now)
            if quiet is not None and now - quiet >= settle_s:
                break
            time.sleep(0.5)
    finally:
        b.close()
    return sorted(removed)


#: cgroup v1's cpu hierarchy; libvirtd puts its guests under ``machine`` (its ``cpu.shares`` is that of the
#: whole partition against every process outside it)
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")


def control_plane_cgroup(pids: Sequence[int], log: Callable[[str], None],
                         root: Path = CPU_CGROUP) -> Path | None:
    """Put the live run's control plane (``pids``: vmctld, the agents, the process submitting the jobs) in a
    cgroup of its own with the CPU share of libvirt's ``machine`` partition, for a run whose real guests
    spin. A spinning fg guest runs at the layout's highest weight: when the partition's share is far above
    a process's (262,144 against 1,024 here), two such guests on a 2-core machine starve everything
    outside it -- an agent went 65 s without a heartbeat and vmctld stopped answering in the first gs run.
    With the same share the control plane gets the CPU it needs and the guests the rest, as on a real
    cluster where vmctld runs elsewhere and an agent is one small process; every other process of this
    machine keeps its share (it competes with both). None (and nothing changed) without a v1 ``machine``
    cgroup or when it cannot be made; :func:`release_cgroup` undoes it."""
    import os

    machine = root / "machine" / "cpu.shares"
    if not machine.exists():
        return None
    d = root / f"vmctl-whatif-{os.getpid()}"
    try:
        shares = int(machine.read_text().strip())
        d.mkdir(exist_ok=True)
        (d / "cpu.shares").write_text(str(shares))
        for p in pids:
            (d / "cgroup.procs").write_text(str(p))
    except (OSError, ValueError) as exc:
        log(f"  live: control plane left in its cgroup ({exc})")
        release_cgroup(d, root)
        return None
    log(f"  live: control plane ({len(pids)} processes) in {d.name}, cpu.shares {shares} as libvirt's machine")
    return d


def release_cgroup(d: Path | None, root: Path = CPU_CGROUP) -> None:
    """Move every process still in ``d`` back to the root cgroup and remove ``d``."""
    import contextlib

    if d is None or not d.exists():
        return
    with contextlib.suppress(OSError):
        for p in (d / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(p)
        d.rmdir()


def _wait_guests(nodes: set[str], count: int, timeout_s: float, log: Callable[[str], None]) -> None:
    """Until the real hosts' placeholder guests (``count``) are defined and started (running, or paused as
    an inactive row): their first boot is not part of any job's time."""
    from vmctl.agents.backends.libvirt.backend import LibvirtBackend
    from vmctl.agents.layout import META_NODE
    from vmctl.errors import VmctlError
    from vmctl.nodedoc import PowerState

    b = LibvirtBackend(LIBVIRT_URI, domain_type="qemu")
    t = time.monotonic()
    try:
        while True:
            # a timeslice layout's inactive row is paused as soon as it has started (a run whose agent is not
            # starved does that before this sees it running)
            up = [v for v in b.list_vms() if v.metadata.get(META_NODE) in nodes
                  and v.power in (PowerState.RUNNING, PowerState.PAUSED)]
            if len(up) >= count:
                log(f"  live: {len(up)} placeholder guests started on the real host(s) after "
                    f"{time.monotonic() - t:.1f} s")
                return
            if time.monotonic() - t > timeout_s:
                raise VmctlError(detail=f"the real hosts' {count} placeholder guests were not started after "
                                        f"{timeout_s:.0f} s ({len(up)} were)")
            time.sleep(0.5)
    finally:
        b.close()


def row_switch_lag(state: Path, epoch: float, speed: float, period: float) -> float | None:
    """How long a core runs neither row at a slice boundary, in model seconds: the agents first turn the
    leaving row's job VMs down (``apply Tune(vm='j...', weight=1``), then resume the arriving row's
    (``apply Resume(vm='j...``); the median lag of the resumes after the boundary minus the median lag of
    the turn-downs. Each line of the mock agents' logs is at model time ``epoch + (t - epoch) x speed``,
    folded into ``[-period/2, period/2)`` around the nearest multiple of ``period`` (the daemon's slices
    start at multiples of the slice of its clock). None without both kinds of line."""
    import datetime as dt
    import re

    pat = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*apply (Resume\(vm='j|Tune\(vm='j\S*, weight=1,)")
    lags: dict[str, list[float]] = {"Resume": [], "Tune": []}
    for log in sorted(state.glob("agent-host*.log")):
        for text in log.read_text(encoding="utf-8", errors="replace").splitlines():
            m = pat.match(text)
            if m is None:
                continue
            wall = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()  # the agents log local time
            model = epoch + (wall - epoch) * speed
            kind = "Resume" if m.group(2).startswith("Resume") else "Tune"
            lags[kind].append((model + period / 2) % period - period / 2)
    if not lags["Resume"] or not lags["Tune"]:
        return None
    return float(np.median(lags["Resume"]) - np.median(lags["Tune"]))


def live_run(fam: Family, jobs: Sequence[tuple[float, dict[str, Any]]], speed: float, tick_s: float,
             state: Path, trace: Path, log: Callable[[str], None], timeout_s: float = 300.0,
             libvirt_hosts: int = 0, guest_dir: Path = GUEST_DIR) -> dict[str, Any]:
    """Run the jobs on a live cluster and export its history to ``trace`` (+ side file). The first
    ``libvirt_hosts`` hosts are ``vmctl-agent`` processes on this machine's libvirtd (their job processes
    sleep or spin in real guests, :func:`guest_spec`). Returns ``where``: vmctl job id -> the nodes of its
    first start, and with real hosts what was left behind at the end (``leftovers``)."""
    import os
    import re

    from vmctl.clock import accelerated_clock
    from vmctl.errors import VmctlError
    from vmctl.files import write_cert_files
    from vmctl.localcluster import DaemonProcess, ManagedProcess, agent_config, free_port, start_agent, wait_registered
    from vmctl.whatif.export import fetch_trace, write_trace

    real = {f"wi{os.getpid()}h{h:02d}" for h in range(libvirt_hosts)}
    if libvirt_hosts:
        from vmctl.guestimage import build

        if not LIBVIRT_SOCKET.exists():
            raise VmctlError(detail=f"libvirtd is not running ({LIBVIRT_SOCKET} is missing): start it "
                                    "(virtlogd -d; libvirtd -d) or run without --libvirt-hosts")
        build(guest_dir, log=None)
        cores_here = os.cpu_count() or 1
        if fam.cores > cores_here:
            raise VmctlError(detail=f"a host of {fam.policy} has {fam.cores} cores, this machine {cores_here}")
    epoch = time.time()
    clock_cfg = {"speed": speed, "epoch": epoch}
    model = accelerated_clock(speed, epoch)
    # a real host's job VM boots for seconds (x speed in model time) within its job's run: no kill at the estimate
    daemon = DaemonProcess(state, policy=fam.policy, tick_s=tick_s, node_timeout_s=30.0,
                           estimate_grace_s=1e6 if libvirt_hosts else 1.0,
                           extra={"clock": clock_cfg, "policy": {"name": fam.policy, "params": dict(fam.params)}})
    agents: list[ManagedProcess] = []
    out: dict[str, Any] = {}
    cgroup: Path | None = None
    try:
        daemon.start_and_wait()
        api = daemon.client()
        nodes = [f"wi{os.getpid()}h{h:02d}" if h < libvirt_hosts else f"host{h:02d}" for h in range(fam.hosts)]
        mock_nodes = [n for n in nodes if n not in real]
        for node in nodes:
            crt, key, ca = write_cert_files(state / "pki", node, api.issue_cert(node))
            certs = {"cert": str(crt), "key": str(key), "ca": str(ca)}
            if node in real:
                cfg = agent_config(node, daemon.url, certs, backend="libvirt", cores=fam.cores,
                                   libvirt_uri=LIBVIRT_URI, metrics_port=free_port(), layout=dict(fam.layout))
                cfg = libvirt_agent_config(cfg, guest_dir, state / f"known_hosts-{node}", list(range(fam.cores)),
                                           int(fam.layout.get("levels", 1)))
            else:
                cfg = agent_config(node, daemon.url, certs, backend="mock", cores=fam.cores, libvirt_uri="",
                                   metrics_port=free_port(), clock=clock_cfg, layout=dict(fam.layout),
                                   peers=mock_nodes, fabric_dir=str(state / "fabric"))
            agents.append(start_agent(node, cfg, state))
        if real and fam.guest == "spin":
            cgroup = control_plane_cgroup([p for p in (daemon.pid, *(a.pid for a in agents), os.getpid()) if p],
                                          log)
        wait_registered(api, agents, state, timeout=120.0)
        if real and fam.layout.get("discipline") != "shared":  # placeholders on every (core, level)
            _wait_guests(real, libvirt_hosts * fam.cores * int(fam.layout.get("levels", 1)), 300.0, log)
        t0 = model.now()
        log(f"  live: vmctld + {fam.hosts} agents ready{f' ({libvirt_hosts} on real libvirt)' if real else ''}; "
            f"{len(jobs)} jobs over {(jobs[-1][0] if jobs else 0) / speed:.0f} s real")
        for at, spec in jobs:
            wait = (t0 + at - model.now()) / speed
            if wait > 0:
                time.sleep(wait)
            s = guest_spec(spec, speed, fam.guest) if real else dict(spec)
            if fam.deadline_relative and "deadline" in s:
                s["deadline"] = model.now() + float(s["deadline"])
            api.submit_job(s)
        end = time.monotonic() + timeout_s
        while True:
            doc = api.call("GET", "/v1/history")
            if len(doc["jobs"]) >= len(jobs):
                break
            if time.monotonic() > end or not daemon.alive():
                ops = api.list_operations(state="pending") if daemon.alive() else []
                stuck = "; ".join(f"{o['id']} ({o['kind']} of job {o['job_id']}, stage {o.get('stage')}, since model "
                                  f"{o['created'] - t0:.0f} s)" for o in ops)
                raise VmctlError(detail=f"the live run did not finish: {len(doc['jobs'])} of {len(jobs)} jobs "
                                        f"finished in {timeout_s:.0f} s real after the last arrival"
                                        f"{f'; operations pending: {stuck}' if stuck else ''} (logs in {state})")
            time.sleep(0.5)
        pat = re.compile("|".join(re.escape(n) for n in nodes))
        out["where"] = {str(j["id"]): sorted(set(pat.findall(next(
            (str(h.get("detail") or "") for h in j.get("history") or () if h.get("event") == "started"), ""))))
            for j in doc["jobs"]}
        out["real_nodes"] = sorted(real)
        out["epoch"] = epoch
        write_trace(fetch_trace(api, None, None), trace)
    finally:
        for a in agents:
            a.stop()
        daemon.stop()
        release_cgroup(cgroup)
        if real:
            removed = remove_libvirt_vms(real)
            domains, qemus = libvirt_leftovers(real)
            alive = [a.name for a in [*agents, daemon] if a.alive()]
            out["leftovers"] = {"domains_removed_after_stop": len(removed), "domains": domains,
                                "qemu_processes": qemus, "our_processes_alive": alive}
    return out


def start_errors(err: dict[str, Any], loop: float, jobs: Sequence[str] | None = None) -> dict[str, Any]:
    """|simulated - live| start of each compared job (or of ``jobs``, SWF numbers): p50, p90, max in model
    seconds and in control-loop periods (``loop`` model seconds), and the signed mean."""
    d = [pj["start_simulated"] - pj["start_actual"] for pj in err["per_job"] if jobs is None or pj["job"] in jobs]
    if not d:
        return {"jobs": 0}
    a = np.abs(np.array(d))
    p50, p90, mx = (float(np.percentile(a, 50)), float(np.percentile(a, 90)), float(a.max()))
    return {"jobs": len(d), "mean": float(np.mean(d)), "p50": p50, "p90": p90, "max": mx,
            "p50_loops": p50 / loop, "p90_loops": p90 / loop, "max_loops": mx / loop}


def _triggers(times: dict[str, list[float]], submits: dict[str, float]) -> list[tuple[float, str, str]]:
    """The events a start can follow, in time order: (time, ``submit`` or ``end``, job)."""
    ev = [(float(t), "submit", k) for k, t in submits.items() if k in times]
    ev += [(float(v[1]), "end", k) for k, v in times.items() if not math.isnan(float(v[1]))]
    return sorted(ev)


def _trigger_of(k: str, start: float, events: Sequence[tuple[float, str, str]], window: float) -> tuple[str, str]:
    """The event a start at ``start`` followed: the latest submit or job end in ``[start - window, start]``
    other than the job's own end; (``timer``, "") when none (a slice or slot boundary, a wake-up)."""
    best: tuple[str, str] = ("timer", "")
    for t, kind, j in events:
        if t > start + 1e-6:
            break
        if t >= start - window and not (kind == "end" and j == k):
            best = (kind, j)
    return best


def divergence(err: dict[str, Any], submits: dict[str, float], loop: float) -> dict[str, Any]:
    """Where the replay first took another decision than the live run. Each start is put down to the
    event it followed (:func:`_trigger_of`): live, the latest job end or submission within 3 control-loop
    periods before it (vmctld decides at its next tick after the event); in the replay, the event at the
    same instant. A start is **divergent** when the two runs put it down to different events *and* it
    differs by more than 2 periods (the median tolerance: a start that follows the same event a loop
    delay later is the same decision). Jobs in the order of their live start: ``jobs_before`` are the
    ones before the first divergent start, with their start error (:func:`start_errors`; the part of the
    run the replay follows decision by decision); ``first`` names the divergent job, both runs' events
    and how far the events' times differ between the runs (an end a few seconds earlier in the replay
    that comes before another job's end, where live it came after: the order of two ends flipped).
    ``divergent`` counts every divergent start (a cascade continues from the first)."""
    per = {p["job"]: p for p in err["per_job"]}
    if not per:
        return {"jobs": 0}
    live = {k: [p["start_actual"], p["response_actual"] + submits[k]] for k, p in per.items()}
    sim = {k: [p["start_simulated"], p["response_simulated"] + submits[k]] for k, p in per.items()}
    lev, sev = _triggers(live, submits), _triggers(sim, submits)
    order = sorted(per, key=lambda k: (live[k][0], k))
    first: dict[str, Any] | None = None
    followed: dict[str, Any] | None = None
    divergent = 0
    before: list[str] = []

    def at(tr: tuple[str, str], times: dict[str, list[float]]) -> float | None:
        if tr[0] == "end":
            return float(times[tr[1]][1])
        return float(submits[tr[1]]) if tr[0] == "submit" else None

    for k in order:
        lt = _trigger_of(k, live[k][0], lev, 3 * loop)
        st = _trigger_of(k, sim[k][0], sev, 1e-6)
        d = sim[k][0] - live[k][0]
        if lt == st and lt[0] != "timer" and (followed is None or abs(d) > abs(followed["difference"])):
            # the same decision, shifted: as late as the event it follows
            followed = {"job": k, "difference": d, "after": list(lt), "event_times": [at(lt, live), at(lt, sim)]}
        if lt != st and abs(d) > 2 * loop:
            divergent += 1
            if first is None:
                first = {"job": k, "live_start": live[k][0], "replay_start": sim[k][0], "difference": d,
                         "live_after": list(lt), "replay_after": list(st),
                         # each run's event, at its time in both runs (None: a timer)
                         "live_event_times": [at(lt, live), at(lt, sim)] if lt[0] != "timer" else None,
                         "replay_event_times": [at(st, live), at(st, sim)] if st[0] != "timer" else None}
        if first is None:
            before.append(k)
    return {"jobs": len(order), "jobs_before": len(before), "divergent": divergent, "first": first,
            "start_error_before": start_errors(err, loop, before) if before else {"jobs": 0},
            "largest_same_decision": followed}


def describe_divergence(div: dict[str, Any]) -> str:
    """One line naming where the replay's decisions diverged from the live run's (:func:`divergence`)."""
    f = div.get("first")
    if not f:
        out = "no divergent decision: every start follows the same event in both runs"
        g = div.get("largest_same_decision")
        if g and g["event_times"][0] is not None and g["event_times"][1] is not None:
            out += (f"; the largest start difference among them, job {g['job']} ({g['difference']:+.1f} s), follows "
                    f"job {g['after'][1]}'s {'arrival' if g['after'][0] == 'submit' else 'end'}, which the replay "
                    f"has {g['event_times'][1] - g['event_times'][0]:+.1f} s from live")
        return out

    def ev(tr: list[str], times: list[float | None] | None) -> str:
        if tr[0] == "timer":
            return "a timer (slice/slot boundary or wake-up)"
        what = f"job {tr[1]}'s {'arrival' if tr[0] == 'submit' else 'end'}"
        if times is None or times[0] is None or times[1] is None:
            return what
        return f"{what} (live {times[0]:.1f} s, replay {times[1]:.1f} s)"

    b = div["start_error_before"]
    tail = (f"; the {div['jobs_before']} jobs before it: start |err| p50/p90/max {b['p50']:.1f}/{b['p90']:.1f}/"
            f"{b['max']:.1f} s" if b.get("jobs") else "")
    return (f"decisions diverge at job {f['job']} ({div['jobs_before']} of {div['jobs']} jobs before it, "
            f"{div['divergent']} divergent starts in all): live it started at {f['live_start']:.1f} s after "
            f"{ev(f['live_after'], f['live_event_times'])}, the replay at {f['replay_start']:.1f} s after "
            f"{ev(f['replay_after'], f['replay_event_times'])}{tail}")


def tolerance(name: str, loop: float) -> dict[str, float]:
    """The per-job start tolerance stated for a family (docs/operations.md, "How far to trust it"), in
    model seconds: the median start within 2 control-loop periods (a live start waits for a decision
    tick and the agents' next pass; the replay starts at the event) and 90 % of the starts within
    ``max(60 s, 12 periods)`` -- beyond the loop delay itself, a job that ends a few seconds later live
    can make the policy choose another job to start or backfill, and from there the two runs' later
    starts differ by whole job lengths; the median says whether the replay follows the live run, the
    p90 how far the diverging tail goes."""
    return {"p50": 2 * loop, "p90": max(60.0, 12 * loop)}


def _on_real(side: dict[str, Any], info: dict[str, Any]) -> list[str] | None:
    """The SWF numbers of the jobs whose first start touched a real host (None: no real host)."""
    realn = set(info.get("real_nodes") or ())
    if not realn:
        return None
    return [k for k, e in side["jobs"].items() if realn & set(info["where"].get(e["vmctl_id"], ()))]


def boot_effect(trace: Path, policy: str, params: dict[str, Any], act: dict[str, Any], submits: dict[str, float],
                loop: float, slice_loss: float = 0.0, on_real: Sequence[str] | None = None) -> dict[str, Any]:
    """What the boot model (the side file's measured ``boot`` per job; :mod:`vmctl.whatif.replay`) changes:
    the boots (count, median, mean, max; on the real host's jobs and the others apart when ``on_real``
    names them), the replay without them (``boot="none"``: mean response, its relative error, the
    start errors) beside the run's own replay, which uses them, and ``tail``: what a rigid job's live run
    took beyond its boot and its work (end - start - boot - work: the report of its processes' exit),
    median and max over all jobs and per host kind."""
    from vmctl.sim.workloads.swf import read_side_file
    from vmctl.whatif.replay import boot_summary, error, replay

    out: dict[str, Any] = boot_summary(trace)
    if not out["jobs"]:
        return out
    side = read_side_file(trace) or {"jobs": {}}
    # what is left of a live run after its boot and its work: the agents' report of the processes' exit
    # (a real guest's over SSH status polls) and any slowdown; rigid jobs with a boot only (a bag's run
    # depends on its workers)
    tails = {k: float(e["end"]) - float(e["start"]) - float(e["boot"]) - float(e["work"])
             for k, e in side["jobs"].items() if e.get("boot") is not None and e.get("shape") is None
             and e.get("end") is not None and e.get("start") is not None and e.get("work") is not None}
    groups = [("all", set(side["jobs"]))]
    if on_real is not None:
        groups += [("real_host", set(on_real)), ("mock_hosts", set(side["jobs"]) - set(on_real))]
    for label, keys in groups:
        b = [float(e["boot"]) for k, e in side["jobs"].items() if k in keys and e.get("boot") is not None]
        t = [v for k, v in tails.items() if k in keys]
        if label != "all":
            out[label] = {"jobs": len(b), **({"median": float(np.median(b)), "max": float(max(b))} if b else {})}
        if t:
            out.setdefault("tail", {})[label] = {"jobs": len(t), "median": float(np.median(t)), "max": float(max(t))}
    p = replay(trace, policy, params, slice_loss=slice_loss, boot="none")
    e = error(p, act, submits)
    out["without"] = {"avg_response": p["avg_response"], "error_relative": e["avg_response_relative"],
                      "start_error": start_errors(e, loop)}
    return out


def run_family(name: str, jobs: int, seed: int, speed: float, tick_s: float, out: Path | None,
               log: Callable[[str], None], whatif: Sequence[str] = (), libvirt_hosts: int = 0,
               sleeping: bool = False, guest_dir: Path = GUEST_DIR, hosts: int | None = None) -> dict[str, Any]:
    """One family's live run, export, replay and comparison (``hosts``: another number of hosts than the
    family's; the tests' tiny run has its one real host alone)."""
    import dataclasses

    from vmctl.sim.workloads.swf import read_side_file
    from vmctl.whatif.replay import actual, error, replay

    fam = SPECS[name] if hosts is None else dataclasses.replace(SPECS[name], hosts=hosts)
    if libvirt_hosts and fam.no_libvirt:
        from vmctl.errors import VmctlError

        raise VmctlError(detail=f"no real-libvirt variant: {fam.no_libvirt}")
    # a family whose guests spin (``Family.guest``) keeps its usages: its real processes use what the model says
    sleeping = (sleeping or libvirt_hosts > 0) and fam.guest == "sleep"
    work = workload(fam, jobs, seed, sleeping=sleeping)
    label = f"{name}{'-libvirt' if libvirt_hosts else ('-sleeping' if sleeping else '')}"
    with tempfile.TemporaryDirectory(prefix=f"vmctl-bench-whatif-{name}-") as tmp:
        folder = (out / label) if out is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / "live" / "vmctld.db").exists():
            from vmctl.errors import VmctlError

            # vmctld would load the earlier run's nodes and jobs: a stale node took a job of a rerun here
            raise VmctlError(detail=f"{folder / 'live'} holds an earlier run's vmctld state: choose another --out")
        trace = folder / "history.swf"
        t = time.monotonic()
        # a real host's bg guests boot on the cycles its fg guests leave, next to everything else this machine
        # runs (their cgroup weight is the lowest): on a loaded machine that can take minutes
        info = live_run(fam, work, speed, tick_s, folder / "live", trace, log, libvirt_hosts=libvirt_hosts,
                        guest_dir=guest_dir, timeout_s=1200.0 if libvirt_hosts else 300.0)
        real = time.monotonic() - t
        side = read_side_file(trace)
        assert side is not None
        act = actual(trace)
        submits = {k: float(e["submit"]) for k, e in side["jobs"].items()}
        loss, plain = 0.0, None
        if "slice" in fam.params:  # gang: the agents' row-switch gap, measured, is what a job loses per slice
            lag = row_switch_lag(folder / "live", float(info["epoch"]), speed, float(fam.params["slice"]))
            if lag is not None and lag > 0:
                loss = lag
                p = replay(trace, fam.policy, fam.params)
                plain = {"slice_loss": 0.0, "avg_response": p["avg_response"],
                         "error": {k: v for k, v in error(p, act, submits).items() if k != "per_job"}}
                plain["start_error"] = start_errors(error(p, act, submits), tick_s * speed)
        sim = replay(trace, fam.policy, fam.params, slice_loss=loss)
        err = error(sim, act, submits)
        states: dict[str, int] = {}
        for e in side["jobs"].values():
            states[e["state"]] = states.get(e["state"], 0) + 1
        loop = tick_s * speed
        res = {"family": name, "label": label, "policy": fam.policy, "params": fam.params, "jobs": jobs,
               "states": states, "speed": speed, "tick_s": tick_s, "loop_delay_model_s": loop, "real_s": real,
               "libvirt_hosts": libvirt_hosts, "sleeping": sleeping, "guest": fam.guest,
               "clock_phase": sim.get("clock_phase", 0.0), "slice_loss": loss, "without_slice_loss": plain,
               "tolerance": tolerance(name, loop),
               "start_error": start_errors(err, loop),
               "divergence": divergence(err, submits, loop),
               "live": {k: v for k, v in act.items() if k != "jobs_json"},
               "simulated": {k: v for k, v in sim.items() if k != "jobs_json"}, "error": err,
               "per_job": {"live": json.loads(act["jobs_json"]), "simulated": json.loads(sim["jobs_json"])}}
        if info.get("real_nodes"):
            realn = set(info["real_nodes"])
            on_real = [k for k, e in side["jobs"].items() if realn & set(info["where"].get(e["vmctl_id"], ()))]
            res["start_error_real_host"] = start_errors(err, loop, on_real)
            res["start_error_mock_hosts"] = start_errors(err, loop, [k for k in side["jobs"] if k not in on_real])
            lv, sm = res["per_job"]["live"], res["per_job"]["simulated"]
            # what a real host adds to a job's run: its live run (end - start) beyond the replay's
            extra = [(lv[k][1] - lv[k][0]) - (sm[k][1] - sm[k][0]) for k in on_real if k in lv and k in sm]
            res["real_host_run_extra"] = {"jobs": len(extra), **({"median": float(np.median(extra)),
                                                                  "max": float(np.max(extra))} if extra else {})}
            res["leftovers"] = info.get("leftovers")
        res["boot"] = boot_effect(trace, fam.policy, fam.params, act, submits, loop, loss,
                                  _on_real(side, info))
        if whatif:  # vmctl whatif's own code on this history (what the command prints after its export)
            from vmctl.whatif.report import render, run_whatif

            doc = run_whatif(trace, list(whatif), {}, side["cluster"]["policy"], 2, folder / "whatif.csv")
            res["whatif_table"] = render(doc)
        if out is not None:
            (folder / "result.json").write_text(json.dumps(res, indent=1), encoding="utf-8")
        return res
