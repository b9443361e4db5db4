"""Benchmark: does ``vmctl whatif`` predict the real daemon? For every policy family, a live cluster runs a
seeded workload, its history is exported through the API and replayed in the simulator under the same
policy on the model of the same cluster, and the simulator's error against the live run is reported.

Run: ``nice -n 10 python -m bench.whatif [--families measy,vcsched,gang,moldable,taskbag] [--jobs 30]
[--speed 25] [--seed 1] [--whatif easy,measy] [--libvirt-hosts 1] [--out DIR]``; ``--families F --replay
DIR/F-libvirt`` replays a kept history again (this code, with and without its boots; no live run).

The testbed is :mod:`vmctl.whatif.fidelity` (the tests run a tiny version of it): one ``vmctld``
process (SQLite) and ``hosts`` ``vmctl-agent`` processes on the mock backend, all on one accelerated
clock (``--speed`` model seconds per real second), laid out for the family's policy; each job is
submitted through the API at its arrival time (``POST /v1/jobs``) until every job has finished. Then
the history is exported exactly as ``vmctl history export`` does (SWF + side file),
:func:`vmctl.whatif.replay.replay` replays it under the policy in force, and
:func:`vmctl.whatif.replay.actual`/:func:`error` compare. Every time is model time.

Families (policy, cluster, jobs; seeded by ``--seed``):

- ``measy`` (paper 000): measy on 4 hosts x 2 cores, layout priority/2; rigid jobs of 1-4 processes,
  200-1200 s of work, CPU usage 0.3-1.0 per job, estimates 1.2-3x the work;
- ``vcsched`` (paper 003): vcsched-gr on 4 hosts x 2 cores, layout shared/1; rigid jobs of 1-3 VMs with a
  CPU need of 0.2-1.0 and memory 0.05-0.3;
- ``gang`` (paper 004): gs-m (mpl 2, slice 100 s) on 4 hosts x 2 cores, layout timeslice/2; rigid jobs;
- ``gang-gs`` (not in the default list): the same with gs (no migrations);
- ``moldable`` (paper 002): moldable (hsret) on 4 hosts x 2 cores, layout priority/2; moldable jobs of
  widths 1, 2, 4 (Amdahl, serial part 5-30 %);
- ``taskbag`` (paper 001): dispatch-priority on 4 hosts x 1 core, layout shared/2 (8 workers); bags of
  1-6 tasks of 100-600 s on at most 4 workers (one per core: the simulator runs one process of a job per
  core), CPU usage 0.01 (sleeping tasks), priorities 0-3, deadlines 2-6 x the bag's work.

``--libvirt-hosts 1``: the first host is a ``vmctl-agent`` on this machine's libvirtd
(``qemu:///system``, running: ``virtlogd -d; libvirtd -d``) whose VMs boot the SSH guest of
``vmctl.guestimage`` (TCG, pinned to this machine's cores) and run each process over SSH. measy and task
bags: as ``sleep w/speed`` (a guest sleeps in real seconds); every process of the workload is then a
sleeping one (CPU usage 0.01, the mock agents and the replay told so). vcsched, gang-gs and moldable
(``Family.guest = "spin"``): as
:func:`vmctl.whatif.fidelity.spin_command`, which consumes ``work x usage / speed`` seconds of its own
CPU time, reading its work and usage from the environment the SSH runner gives it
(``VMCTL_WORK_SECONDS``, a moldable job's time at the width HSRET chose; ``VMCTL_CPU_USAGE``, a vcsched
VM's CPU need): a cap, a paused row and a width change its run as they change the model's; the workload
keeps its usages. Each family first runs its all-mock baseline of that same workload in this process. At
the end the run removes the real host's domains and counts what is left (domains, QEMU processes,
vmctld/agent processes; the bench fails unless all are zero). Families without the variant say why
(``Family.no_libvirt``): gs-m migrates, and one libvirtd here refuses a migration to itself. vcsched's
VMs are shared (unpinned, no (core, level) slot): the real host forwards their SSH ports from the
layout's second range (``layout.shared_ssh_ports``, the lowest free port to each VM the agent defines).

Output: one line per run -- mean response live and simulated, the relative error, the per-job start
error |simulated - live| (p50/p90/max in model seconds and in control-loop periods, ``tick x speed``),
the tolerance and the verdict; with a real host also the starts of the jobs that ran there and on the
mock hosts, what a real host added to a job's run, and what was left behind; then the boot delays the
history measured (vmctld's start -> the agents' first report of every process running; on the real host
and on the mock hosts), the live runs' tail beyond boot + work (the processes' exit report), and the
replay without the boots (``boot="none"``) beside the run's replay, which uses them; with ``--out`` every
run's result (means, per-job times) as JSON. The bound asked for: mean response within 5 %; per-job
starts within the tolerance of :func:`vmctl.whatif.fidelity.tolerance` (median within 2 control-loop
periods, 90 % within ``max(60 s, 12 periods)``; docs/operations.md, "How far to trust it", gives the
reasons and the measured numbers).
"""


from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vmctl.whatif.fidelity import EXTRA, FAMILIES, GUEST_DIR, SPECS, describe_divergence, run_family


def _st(s: dict[str, Any]) -> str:
    if not s.get("jobs"):
        return "-"
    return (f"{s['p50']:.1f}/{s['p90']:.1f}/{s['max']:.1f} s = {s['p50_loops']:.1f}/{s['p90_loops']:.1f}/"
            f"{s['max_loops']:.1f} loops")


def line(r: dict[str, Any]) -> str:
    e = r["error"]
    rel = e["avg_response_relative"]
    s, tol = r["start_error"], r["tolerance"]
    ok_mean = rel is not None and abs(rel) <= 0.05
    ok_start = s.get("jobs", 0) > 0 and s["p50"] <= tol["p50"] + 1e-9 and s["p90"] <= tol["p90"] + 1e-9
    verdict = ("ok" if ok_mean else "MEAN OUTSIDE 5%") + (", starts ok" if ok_start else ", STARTS OUTSIDE")
    text = (f"{r['label']:<16} {r['policy']:<18} jobs {r['live']['jobs']:>3}  "
            f"resp live {r['live']['avg_response']:8.1f}  sim {r['simulated']['avg_response']:8.1f}  err {rel:+7.1%}  "
            f"start |err| p50/p90/max {_st(s)} (tol {tol['p50']:.0f}/{tol['p90']:.0f} s)  "
            f"wait live {r['live']['avg_wait']:7.1f} sim {r['simulated']['avg_wait']:7.1f}  "
            f"migr {r['live']['migrations']}/{r['simulated']['migrations']}  {verdict}  [{r['real_s']:.0f} s real]")
    if not ok_start and r.get("divergence"):
        text += "\n" + divergence_line(r)
    if r.get("without_slice_loss"):
        w = r["without_slice_loss"]
        text += (f"\n  replayed with the agents' measured row-switch gap of {r['slice_loss']:.1f} s lost per slice; "
                 f"without it: err {w['error']['avg_response_relative']:+.1%}, start |err| {_st(w['start_error'])}")
    if r.get("libvirt_hosts"):
        x, lo = r["real_host_run_extra"], r.get("leftovers") or {}
        text += (f"\n  jobs on the real host: {r['start_error_real_host'].get('jobs', 0)}, start |err| "
                 f"{_st(r['start_error_real_host'])}; on mock hosts {_st(r['start_error_mock_hosts'])}; "
                 f"live run - replay run on the real host: median {x.get('median', float('nan')):.1f} s, max "
                 f"{x.get('max', float('nan')):.1f} s\n  left behind: {len(lo.get('domains', []))} domains, "
                 f"{len(lo.get('qemu_processes', []))} QEMU processes, {len(lo.get('our_processes_alive', []))} "
                 f"vmctld/agent processes ({lo.get('domains_removed_after_stop', 0)} domains removed after the "
                 f"agents stopped)")
    return text


def boot_line(r: dict[str, Any]) -> str:
    """The boot model's part of a run's report (``r["boot"]``, :func:`vmctl.whatif.fidelity.boot_effect`)."""
    b = r.get("boot") or {}
    if not b.get("jobs"):
        return "  boot delays: none in the history (replayed as before)"
    parts = [f"  boot delays (decision -> every process running, model s): {b['jobs']} jobs, median "
             f"{b['median']:.1f}, mean {b['mean']:.1f}, max {b['max']:.1f}"]
    for label in ("real_host", "mock_hosts"):
        x = b.get(label)
        if x and x.get("jobs"):
            parts.append(f"{label.replace('_', ' ')}: median {x['median']:.1f}, max {x['max']:.1f} ({x['jobs']} jobs)")
    tails = [f"{label.replace('_', ' ')} median {x['median']:.1f}, max {x['max']:.1f} ({x['jobs']} jobs)"
             for label, x in (b.get("tail") or {}).items()]
    if tails:
        parts.append("live run beyond boot + work (exit report): " + ", ".join(tails))
    w = b["without"]
    text = "; ".join(parts)
    return (text + f"\n  replayed with them (above); without them: resp sim {w['avg_response']:.1f}, err "
            f"{w['error_relative']:+.1%}, start |err| {_st(w['start_error'])}")

def divergence_line(r: dict[str, Any]) -> str:
    """Why the starts are outside the tolerance: where the replay's decisions first diverged from the live
    run's (:func:`vmctl.whatif.fidelity.divergence`), and whether the jobs before that point are within it
    (then the tail is the cascade of that one decision: the cause the tolerance's p90 allows for)."""
    div, tol = r["divergence"], r["tolerance"]
    b = div.get("start_error_before") or {}
    within = bool(b.get("jobs")) and b["p50"] <= tol["p50"] + 1e-9 and b["p90"] <= tol["p90"] + 1e-9
    if "slice" in r.get("params", {}):
        cause = ("cause: the slice-boundary cliff: a gang job whose end falls within the row-switch gap of a slice "
                 "boundary ends a whole cycle later in one run, and the jobs that follow its end start that much later"
                 + ("; here the shifted end also changed a decision (above), and the jobs before it are within the "
                    "tolerance" if div.get("first") is not None and within else ""))
    elif div.get("first") is not None and within:
        cause = ("cause: diverging decisions (a cascade from one decision); the replay follows the live run "
                 "within the tolerance up to it")
    elif div.get("first") is None:
        cause = "cause: the same decisions, as late as the ends they follow (a delay the replay does not model)"
    else:
        cause = "cause: not only the divergence: the starts before it are outside the tolerance too"
    return f"  {describe_divergence(div)}\n  {cause}"


def reexport(folder: Path) -> str:
    """``--reexport``: write ``DIR/history.swf`` (+ side file) again from the run's own store
    (``DIR/live/vmctld.db``, the job archive included) with this code's export (``GET /v1/history``'s
    documents, ``build_trace``), keeping the cluster and policy the side file recorded; the old pair is
    kept as ``history.swf.orig`` (+ side file) the first time. For a history exported before the API
    showed what it now does (a bag's worker boots)."""
    import shutil

    from vmctl.api.routes.jobs import _history_json
    from vmctl.sim.workloads.swf import read_side_file, side_file_path
    from vmctl.store import open_store
    from vmctl.whatif.export import build_trace, write_trace

    trace = folder / "history.swf"
    side = read_side_file(trace)
    db = folder / "live" / "vmctld.db"
    if side is None or not db.exists():
        return f"{folder}: no history.swf with a side file and live/vmctld.db"
    orig = folder / "history.swf.orig"
    if not orig.exists():
        shutil.copy(trace, orig)
        shutil.copy(side_file_path(trace), side_file_path(orig))
    store = open_store(str(db), must_exist=True)
    try:
        final = ("done", "failed", "killed", "cancelled")
        recs = [(r, False) for r in store.load_jobs() if r.state.value in final]
        recs += [(r, True) for r in store.list_archived_jobs(limit=1_000_000)]
    finally:
        store.close()
    jobs = [_history_json(r, a) for r, a in recs]
    cl = side["cluster"]
    policy = {"name": cl["policy"]["name"], "params": cl["policy"]["params"], "layout": cl.get("layout")}
    t = build_trace(jobs, cl["nodes"], policy, source=str(side.get("source") or ""))
    write_trace(t, trace)
    return f"{folder}: re-exported {t.jobs} jobs from {db} (node boots: {t.side.get('node_boots') or 'none'})"


def replay_kept(folder: Path, name: str) -> str:
    """``--replay DIR``: the history a run kept (``--out``: ``DIR/history.swf`` + side file) replayed again
    by this code under its family's policy, with the measured boots and without them (and, when the side
    file has ``node_boots``, with each bag's mean boot on every worker instead: ``boot=bag``)."""
    from vmctl.sim.workloads.swf import read_side_file
    from vmctl.whatif.fidelity import start_errors
    from vmctl.whatif.replay import actual, error, replay

    trace = folder / "history.swf"
    fam = SPECS[name]
    side = read_side_file(trace)
    if side is None:
        return f"{folder}: no history.swf with a side file"
    act = actual(trace)
    submits = {k: float(e["submit"]) for k, e in side["jobs"].items()}
    out = [f"{folder}: {fam.policy}, {act['jobs']} jobs, live mean response {act['avg_response']:.1f}"]
    kept = folder / "result.json"  # a gang run's measured row-switch gap, replayed as the run's own line did
    loss = float(json.loads(kept.read_text()).get("slice_loss") or 0.0) if kept.exists() else 0.0
    if loss:
        out[0] += f" (replayed with the run's measured row-switch gap of {loss:.2f} s lost per slice)"
    nb = side.get("node_boots")
    if nb:  # the task bags' workers' boots per node: boot=own gives each worker its node's, boot=bag the bag's mean
        out.append("  node boots (median first-run boot of the bags' workers there, model s): "
                   + ", ".join(f"{n} {b:.1f}" for n, b in nb.items()))
    for boot in ("own", "bag", "none") if nb else ("own", "none"):
        sim = replay(trace, fam.policy, fam.params, boot=boot, **({"slice_loss": loss} if loss else {}))
        e = error(sim, act, submits)
        out.append(f"  boot={boot:<4} replay {sim['avg_response']:8.1f}  err {e['avg_response_relative']:+7.1%}  "
                   f"start |err| {_st(start_errors(e, 2.0))}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.whatif", description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--speed", type=float, default=25.0, help="model seconds per real second")
    ap.add_argument("--tick", type=float, default=0.2, help="vmctld's decision tick, real seconds")
    ap.add_argument("--whatif", default="", metavar="POLICIES",
                    help="also print vmctl whatif's table of each family's history under these policies")
    ap.add_argument("--out", type=Path, default=None, help="keep each family's trace, logs and result.json here")
    ap.add_argument("--libvirt-hosts", type=int, default=0, metavar="N",
                    help="make the first N hosts vmctl-agents on this machine's libvirtd (real TCG guests whose job "
                         "processes sleep, or spin their work in CPU time: vcsched, gang-gs, moldable); each family "
                         "also runs its all-mock baseline of the same workload first, in this process")
    ap.add_argument("--guest-dir", type=Path, default=GUEST_DIR, help="the SSH guest's build (cached)")
    ap.add_argument("--reexport", action="store_true",
                    help="with --replay: first export DIR/history.swf again from DIR/live/vmctld.db with this code")
    ap.add_argument("--replay", type=Path, default=None, metavar="DIR",
                    help="only replay the history a run kept with --out (DIR/history.swf) under the first of "
                         "--families, with and without its measured boots; no live run")
    a = ap.parse_args(argv)
    if a.replay is not None:
        if a.reexport:
            print(reexport(a.replay))
        print(replay_kept(a.replay, a.families.split(",")[0].strip()))
        return 0
    names = [f.strip() for f in a.families.split(",") if f.strip()]
    bad = [n for n in names if n not in SPECS]
    if bad or a.jobs < 1 or not a.speed > 0 or not 0 <= a.libvirt_hosts <= 1:
        print(f"error: unknown families {bad} (known: {', '.join(FAMILIES + EXTRA)}), --jobs/--speed not positive, "
              "or --libvirt-hosts not 0 or 1 (one libvirtd here: its hosts would share this machine's cores)",
              file=sys.stderr)
        return 2
    import os

    from vmctl.errors import VmctlError

    load = os.getloadavg()[0]
    real = f", {a.libvirt_hosts} real-libvirt host" if a.libvirt_hosts else ""
    print(f"# bench.whatif: {a.jobs} jobs per family, seed {a.seed}, clock {a.speed:g}x, tick {a.tick:g} s real "
          f"(control loop {a.tick * a.speed:g} model s){real}; load average {load:.1f}")
    code = 0
    for n in names:
        if a.libvirt_hosts and SPECS[n].no_libvirt:
            print(f"{n:<16} no real-libvirt variant: {SPECS[n].no_libvirt}", flush=True)
            continue
        runs = [(0, True), (a.libvirt_hosts, True)] if a.libvirt_hosts else [(0, False)]
        base: dict[str, Any] | None = None
        for lv, sleeping in runs:
            try:
                r = run_family(n, a.jobs, a.seed, a.speed, a.tick, a.out, lambda s: print(s, file=sys.stderr),
                               [p.strip() for p in a.whatif.split(",") if p.strip()], libvirt_hosts=lv,
                               sleeping=sleeping, guest_dir=a.guest_dir)
            except VmctlError as exc:
                print(f"{n:<16} error: {exc}", flush=True)
                code = 1
                continue
            print(line(r), flush=True)
            print(boot_line(r), flush=True)
            if "whatif_table" in r:
                print(r["whatif_table"], flush=True)
            if lv == 0:
                base = r
            elif base is not None:
                b, x = base["error"]["avg_response_relative"], r["error"]["avg_response_relative"]
                print(f"  real host vs all-mock baseline (same workload, this process): mean response error "
                      f"{x:+.1%} vs {b:+.1%}; start |err| p90 {r['start_error']['p90']:.1f} vs "
                      f"{base['start_error']['p90']:.1f} s", flush=True)
            lo = r.get("leftovers")
            if lo and (lo["domains"] or lo["qemu_processes"] or lo["our_processes_alive"]):
                print(f"{n:<16} error: left behind {lo}", flush=True)
                code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
