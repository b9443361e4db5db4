"""The demo's workload: the first jobs of a generated model workload (Feitelson 1996 by default),
scaled to the demo's clock and duration, as job specs for the API with their arrival offsets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vmctl import errors
from vmctl.errors import DemoError


@dataclass(frozen=True)
class DemoJob:
    name: str
    at: float  # seconds after the demo's start (real time)
    spec: dict[str, Any]  # times (estimate, work): model seconds (compressed: real seconds)
    model_run_time: float


def build_demo_workload(n_jobs: int, total_cores: int, speed: float, duration: float, seed: int,
                        model: str = "feitelson96", compress: bool = False,
                        command: Callable[[float], str] | None = None) -> tuple[list[DemoJob], dict[str, Any]]:
    """The first ``n_jobs`` of a generated model workload for a machine of ``total_cores`` cores, for
    a clock running ``speed`` model seconds per real second: job times stay in model seconds, the
    arrival offsets ``at`` are real seconds (model / speed, squeezed further when the arrivals would
    not fit into the first half of ``duration``), and run times are capped at a third of ``duration``
    (real seconds, i.e. ``duration / 3 * speed`` model seconds) so the demo ends in time.

    ``compress``: for a daemon on a real-time clock (``--backend libvirt``), job times are divided by
    ``speed`` too (the spec's times are then real seconds).

    ``command``: each task's command from its run time (in the spec's unit), for agents that run the
    processes in real guests (``vmctl.cli.demo.guests.guest_command``); mock agents need none."""
    from vmctl.sim.workloads.registry import MODELS, generate_model

    if model not in MODELS:
        raise errors.OutOfRange(what="workload model", value=model, allowed=" | ".join(MODELS))
    built = generate_model(model, n_jobs, total_cores, seed, usage="paper")
    jobs = list(built.jobs)[:n_jobs]
    if not jobs:
        raise DemoError(what="workload", problem=f"model {model} generated no jobs")
    t0 = min(float(j.submit) for j in jobs)
    span = max(float(j.submit) for j in jobs) - t0
    arrival_scale = 1.0 / speed
    if span / speed > duration * 0.5 and span > 0:
        arrival_scale = duration * 0.5 / span  # squeeze arrivals further so all jobs arrive in time
    max_run = duration / 3.0 * speed
    capped = 0
    out = []
    for j in sorted(jobs, key=lambda x: (float(x.submit), x.id)):
        run = float(j.run_time)
        if run > max_run:
            run = max_run
            capped += 1
        run = max(run, 0.2 * speed)  # at least 0.2 real seconds
        estimate = max(float(j.estimate), run * 1.05)
        unit = 1.0 / speed if compress else 1.0
        run, estimate = run * unit, estimate * unit
        procs = max(1, min(int(j.procs), total_cores))
        usage = list(j.cpu_usage)[:procs] if j.cpu_usage else None
        if usage is not None and len(usage) < procs:
            usage = usage + [usage[-1]] * (procs - len(usage))
        tasks = [{"work_seconds": round(run, 3),
                  **({"cpu_usage": usage[i]} if usage else {}),
                  **({"command": command(round(run, 3))} if command is not None else {})} for i in range(procs)]
        spec: dict[str, Any] = {"name": f"{model}-{j.id}", "procs": procs, "estimate": round(estimate, 3),
                                "tasks": tasks}
        if usage is not None:
            spec["cpu_usage"] = usage
        out.append(DemoJob(name=spec["name"], at=(float(j.submit) - t0) * arrival_scale, spec=spec,
                           model_run_time=float(j.run_time)))
    info = {"model": model, "jobs": len(out), "source": built.source, "arrival_scale": arrival_scale,
            "capped_run_times": capped, "speed": speed, "compressed": compress}
    return out, info
