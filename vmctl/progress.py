"""The progress model of a process in the two-tier (fg/bg) architecture (MEASY paper sec. 3.2, 2.1).

One model for the simulator and vmctld: the simulator (``vmctl.sim.engine``) draws ``loss`` and
``beta`` per job (``ProgressModel.draw``) and feeds the modelled fg usage; vmctld
(``vmctl.daemon.state``) has no per-job draw and no measured beta, so it uses the model's *expected*
values (``ProgressModel.expected_beta``: the mean of the job-size's beta distribution; loss 0: a real
fg VM runs at the pace of the wall clock in the daemon's model, as before) with the fg utilization its
agents measure (``bg_job_rate``).

The formulas of sec. 3.2 were lost in the conversion of the paper; this module reconstructs them from
the prose. Every quantity is a *rate*: dedicated-core seconds of work a process receives per wall
second. Rates are piecewise constant (they change only at events), which is what a discrete-event
simulator needs: a job's completion time is ``t0 + (work - progress) / rate`` until the next change.

Foreground process (sec. 3.2, first formula)::

    rate_fg = 1 - loss,   loss ~ U(0.5 %, 4 %)

``loss`` is the context-switch overhead of the two-tier architecture compared with a processor used
exclusively (one-tier VM, sec. 2.1 (1)). Our reading: the loss is a property of the *job* on the
two-tier architecture, drawn once per job. It applies to every process of a two-tier policy (KEASY,
REASY, MEASY: both VCPUs are always pinned on the core, whether or not the bg VM runs something) and
never to a one-tier policy (FCFS, EASY, SJF: the baseline of the paper's comparison runs on dedicated
processors). Drawing once per job rather than per time slice keeps rates piecewise constant; over a
job's many slices the per-slice draws would average out to the same mean anyway, so a per-job draw
is the event-driven equivalent with a little more variance between jobs.

Background process (sec. 3.2, second formula)::

    rate_bg = beta * min(1, (1 - u_fg) / u_bg)     when the core's fg VM runs a process
    rate_bg = 0                                    when u_fg > 0.96 (sec. 2.1 (3))
    rate_bg = 1 - loss                             when the core's fg slot is idle

``u_fg`` is the actual CPU usage of the fg process on that core, ``u_bg`` the bg process's own usage
on a dedicated core: the bg process needs ``u_bg`` of the cycles to run at full pace, and it gets at
most the ``1 - u_fg`` the fg VM leaves idle. ``beta`` (0..1) is the fraction of those idle cycles that
turns into progress (frequent preemption, cache pollution). When the fg slot is idle the bg VM is in
effect the fg VM (the paper's Fig. 1 example: J8 "is actually the foreground VM because its
foreground VM is idle"): it runs like a fg process, at ``1 - loss``.

``beta`` is drawn once per job (sec. 2.1 (2)): U(0.80, 0.92) for a one-process job; for a
multi-process job a normal distribution restricted to [0.198, 0.766] whose mean and sigma were lost
in the paper. We take the midpoint of the range as the mean (0.482) and sigma = range / 6 = 0.0947,
so that the measured range is +-3 sigma, and clip the draws to the range (0.27 % of the draws are
clipped).

A job advances at the pace of its slowest process (sec. 3.2, last sentence): its rate is the minimum
over its processes.

Every draw is made up front for the whole workload, from one ``numpy.random.Generator`` seeded from
the run's seed: one row of three uniforms per job in workload order (loss, one-process beta,
multi-process beta through the normal inverse CDF). Row ``i`` depends only on the seed and ``i``, so a
job's draws do not depend on the policy, on what happened to other jobs, or on how long the workload
is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from vmctl.errors import ValidationError

#: a bg process makes no progress above this fg utilization (MEASY sec. 2.1 (3))
BG_THRESHOLD = 0.96


@dataclass(frozen=True, slots=True)
class ProgressModel:
    """Parameters of the progress model; the defaults are the paper's (see the module docstring)."""

    loss_low: float = 0.005
    loss_high: float = 0.04
    beta_single_low: float = 0.80
    beta_single_high: float = 0.92
    beta_multi_low: float = 0.198
    beta_multi_high: float = 0.766
    beta_multi_mean: float = 0.482
    beta_multi_sigma: float = (0.766 - 0.198) / 6.0
    bg_threshold: float = BG_THRESHOLD

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss_low <= self.loss_high < 1.0:
            raise ValidationError(field="progress.loss", problem="need 0 <= low <= high < 1")
        for name, lo, hi in (
            ("beta_single", self.beta_single_low, self.beta_single_high),
            ("beta_multi", self.beta_multi_low, self.beta_multi_high),
        ):
            if not 0.0 < lo <= hi <= 1.0:
                raise ValidationError(field=f"progress.{name}", problem="need 0 < low <= high <= 1")
        if self.beta_multi_sigma < 0:
            raise ValidationError(field="progress.beta_multi_sigma", problem="must be >= 0")
        if not 0.0 < self.bg_threshold <= 1.0:
            raise ValidationError(field="progress.bg_threshold", problem="must be in (0, 1]")

    def draw(self, seed: int, procs: np.ndarray) -> tuple[list[float], list[float]]:
        """Per-job ``loss`` and ``beta`` for a workload whose job sizes are ``procs`` (in workload order).

        Both arrays are drawn in full whatever the job sizes, so the draws of job ``i`` depend only on
        ``seed`` and ``i``."""
        n = int(procs.shape[0])
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5EED]))
        # one row of three uniforms per job, in workload order: row i depends on (seed, i) only
        u = rng.random((n, 3))
        from scipy import special  # imported when drawn (two-tier runs): 26 MB a one-tier run does not need

        loss = self.loss_low + (self.loss_high - self.loss_low) * u[:, 0]
        single = self.beta_single_low + (self.beta_single_high - self.beta_single_low) * u[:, 1]
        normal = self.beta_multi_mean + self.beta_multi_sigma * special.ndtri(np.clip(u[:, 2], 1e-12, 1 - 1e-12))
        multi = np.clip(normal, self.beta_multi_low, self.beta_multi_high)
        beta = np.where(procs <= 1, single, multi)
        return loss.tolist(), beta.tolist()

    def bg_process_rate(self, beta: float, loss: float, u_bg: float, u_fg: float | None) -> float:
        """Rate of one bg process; ``u_fg`` is None when the core's fg slot is idle."""
        if u_fg is None:
            return 1.0 - loss
        if u_fg > self.bg_threshold:
            return 0.0
        return beta * min(1.0, (1.0 - u_fg) / u_bg)

    def expected_beta(self, procs: int) -> float:
        """The mean of the beta distribution ``draw`` uses for a job of ``procs`` processes: what vmctld
        takes for beta, since it draws nothing and a real guest does not report it (the multi-process
        mean is the distribution's, clipping included)."""
        if procs <= 1:
            return (self.beta_single_low + self.beta_single_high) / 2.0
        return _clipped_normal_mean(self.beta_multi_mean, self.beta_multi_sigma, self.beta_multi_low,
                                    self.beta_multi_high)

    def bg_job_rate(self, beta: float, loss: float, processes: Iterable[tuple[float, float | None]]) -> float:
        """Rate of a bg job: its slowest process's ``bg_process_rate``; ``processes`` gives each
        process's ``(u_bg, u_fg)`` (``u_fg`` None where the core's fg slot is idle). 0 for no process."""
        rates = [self.bg_process_rate(beta, loss, u_bg, u_fg) for u_bg, u_fg in processes]
        return min(rates) if rates else 0.0


def _pdf(z: float) -> float:
    return math.exp(-z * z / 2.0) / math.sqrt(2.0 * math.pi)


def _clipped_normal_mean(mean: float, sigma: float, lo: float, hi: float) -> float:
    """E[clip(X, lo, hi)] for X ~ N(mean, sigma)."""
    if sigma <= 0:
        return min(hi, max(lo, mean))
    from scipy import special  # imported when asked: 26 MB

    a, b = (lo - mean) / sigma, (hi - mean) / sigma
    cdf_a, cdf_b = float(special.ndtr(a)), float(special.ndtr(b))
    inside = mean * (cdf_b - cdf_a) + sigma * (_pdf(a) - _pdf(b))
    return lo * cdf_a + inside + hi * (1.0 - cdf_b)


def fg_rate(loss: float, two_tier: bool) -> float:
    """Rate of a fg process (and of its job): ``1 - loss`` on the two-tier architecture, 1 otherwise."""
    return 1.0 - loss if two_tier else 1.0
