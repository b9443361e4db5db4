"""The reproduction framework: a paper's claims, the experiments behind them, verdicts, claims.md/.parquet.

A paper module (``vmctl/reproduce/pNNN.py``) defines one module-level ``PAPER = Paper(...)``:

.. code-block:: python

    from vmctl.experiments.runner import grid
    from vmctl.experiments.sweep import sweep_cell
    from vmctl.reproduce.base import Claim, Experiment, Outcome, Paper, Results, Size, compare_order, compare_value

    SIZES = {
        # seeds: the replicates; params: free-form scalars the experiments read; est_cpu_s: CPU seconds of
        # all cells (--full prints est_cpu_s / workers); reduced: what this size cut from the paper's, in words
        "quick": Size("quick", "5,000 jobs per run, loads 0.5/0.7/0.9, 3 seeds", seeds=(1, 2, 3), est_cpu_s=900,
                      params={"jobs": 5000}, reduced="200,000 jobs and 6 loads in the paper"),
        "full": Size("full", "200,000 jobs, 6 loads, 3 seeds", seeds=(1, 2, 3), est_cpu_s=3 * 3600,
                     params={"jobs": 200000}),
    }

    def fw_cells(size: Size, prior: Results) -> list[Cell]:      # an experiment = a grid of runner cells
        return grid(sweep_cell, {"jobs": size.p("jobs"), ...}, policy=[...], load=[...], seed=list(size.seeds))

    def fw_summary(res: Results) -> str:                          # optional: the table claims.md shows
        return "| policy | ... |\n|---|...|\n" + ...            # under the experiment (the evidence)

    def best_gain(res: Results) -> Outcome:                       # a claim's evaluation
        per_seed = [...one number per seed, computed from res.rows("fw", policy="measy")...]
        out = compare_value(41.1, per_seed, unit="%")
        if out.verdict != "holds":
            out = out.because("our FWload gains shrink at high load (fw: 36-47 % at 0.8-0.95)", "fw")
        return out

    PAPER = Paper(
        id="000", title="...", source="shared/seeds/000_....txt", sizes=SIZES,
        experiments=[Experiment("fw", "FWload sweep, 4 policies", fw_cells, summary=fw_summary)],
        claims=[Claim("000-1", "MEASY's best response-time gain over EASY", where="sec. 3.4", paper="41.1 %",
                      metric="best gain over the (workload, load) points, per seed, %", evaluate=best_gain)],
    )

Rules for a paper module: experiment names are unique within the paper (the table is
``DIR/<name>.parquet``; a cause's evidence names them); cell functions are module-level (importable by
Dask workers; reuse the existing ones: ``vmctl.experiments.sweep:sweep_cell``,
``vmctl.experiments.vcsched:eval_cell``, ...); a cell's inputs include the seed, so every seed is its own
cell; ``evaluate`` reads only ``Results`` (never files), so a rerun from the tables gives the same claims.
The registry (:mod:`vmctl.reproduce.registry`) already names ``p000`` ... ``p004``; a module not yet in
the build is listed as "not available in this build".

Running a paper (:func:`vmctl.reproduce.run.reproduce`) runs its experiments in order, each as one grid
on the experiment runner (:mod:`vmctl.experiments.runner`) into ``DIR/<experiment>.parquet`` -- a rerun
skips every finished cell -- and hands each experiment's ``cells`` the rows of the earlier ones
(``prior``), so a later grid may depend on an earlier result (a calibration). Then every claim's
``evaluate`` turns the rows into an :class:`Outcome` and the claims go to ``DIR/claims.md`` and
``DIR/claims.parquet``.

Verdict rules (one of two, named in every row's ``rule`` column):

``value`` (:func:`compare_value`, a number the paper reports)
    *holds* when the paper's value lies inside our 95 % interval of the mean over seeds (Student t;
    with one seed the interval is that seed's value, so only equality holds) or within the claim's stated
    tolerance of our mean; *contradicted* when our whole interval lies on the other side of zero from
    the paper's value (the effect has the opposite sign, significantly); *differs* otherwise.
``order`` (:func:`compare_order`, a direction or ordering: "A beats B")
    the claim gives one signed margin per (seed, point), positive when the paper's ordering holds there;
    *holds* when it holds at every point in every seed; *contradicted* when the opposite ordering holds
    significantly: the 95 % interval over seeds of the per-seed mean margin lies entirely below zero;
    *differs* otherwise (it holds on average or at some points, not everywhere). ``ours`` is the mean
    margin with its interval.

Every claim whose verdict is not *holds* carries a cause and names the experiments (tables in DIR) that
back it (:meth:`Outcome.because`); a cause without evidence is reported as "not explained".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from vmctl.errors import ValidationError
from vmctl.experiments import inputs
from vmctl.experiments.runner import Cell, Scalar

Verdict = Literal["holds", "differs", "contradicted"]
VERDICTS: tuple[Verdict, ...] = ("holds", "differs", "contradicted")
Mode = Literal["quick", "full"]

RULES: dict[str, str] = {
    "value": "holds when the paper's value lies in our 95 % interval over seeds (or within the stated "
             "tolerance of our mean); contradicted when our interval lies entirely on the other side of zero; "
             "else differs",
    "order": "holds when the paper's ordering holds at every point in every seed; contradicted when the "
             "opposite ordering holds significantly (95 % interval of the mean margin entirely below 0); "
             "else differs",
}
UNEXPLAINED = "not explained by an experiment of this run"


# ------------------------------------------------------------------------------------ estimates


@dataclass(frozen=True, slots=True)
class Estimate:
    """Mean over seeds and the 95 % interval of the mean (Student t; lo == hi == mean for one seed)."""

    mean: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, samples: Iterable[float]) -> Estimate:
        xs = [float(x) for x in samples]
        if not xs or any(not math.isfinite(x) for x in xs):
            raise ValidationError(field="estimate", problem=f"needs finite samples, got {xs}")
        n = len(xs)
        mean = sum(xs) / n
        if n == 1:
            return cls(mean, mean, mean, 1)
        from scipy import stats

        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
        half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
        return cls(mean, mean - half, mean + half, n)

    def text(self, unit: str = "", digits: int = 2) -> str:
        u = f" {unit}" if unit and unit != "%" else unit and " %"
        if self.n == 1:
            return f"{self.mean:,.{digits}f}{u} (1 seed)"
        return f"{self.mean:,.{digits}f}{u} [{self.lo:,.{digits}f}, {self.hi:,.{digits}f}] (n={self.n})"


# ------------------------------------------------------------------------------------- outcomes


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a claim's evaluation found: our estimate, the verdict, the rule, and (unless it holds) the
    cause and the experiments behind it. ``detail``: one line of context (e.g. "at 11 of 12 points")."""

    ours: Estimate
    verdict: Verdict
    rule: str
    unit: str = ""
    detail: str = ""
    cause: str = ""
    evidence: tuple[str, ...] = ()

    def because(self, cause: str, *evidence: str) -> Outcome:
        """This outcome with its cause, backed by the named experiments (tables in the output)."""
        return replace(self, cause=cause, evidence=tuple(evidence))

    def noting(self, detail: str) -> Outcome:
        return replace(self, detail=detail)


def compare_value(paper: float, samples: Sequence[float], unit: str = "", tolerance: float = 0.0) -> Outcome:
    """The ``value`` rule (module docstring): the paper's number against our per-seed numbers."""
    est = Estimate.of(samples)
    verdict: Verdict
    if est.lo - tolerance <= paper <= est.hi + tolerance:
        verdict = "holds"
    elif (paper > 0 and est.hi < 0) or (paper < 0 and est.lo > 0):
        verdict = "contradicted"
    else:
        verdict = "differs"
    return Outcome(est, verdict, "value", unit=unit)


def compare_order(margins: Mapping[int, Sequence[float]], unit: str = "") -> Outcome:
    """The ``order`` rule (module docstring): ``margins`` maps each seed to its per-point margins
    (positive where the paper's ordering holds)."""
    if not margins or any(not m for m in margins.values()):
        raise ValidationError(field="margins", problem="every seed needs at least one point")
    per_seed = [sum(m) / len(m) for m in margins.values()]
    est = Estimate.of(per_seed)
    points = [x for m in margins.values() for x in m]
    held = sum(1 for x in points if x > 0)
    verdict: Verdict
    if held == len(points):
        verdict = "holds"
    elif est.n > 1 and est.hi < 0:
        verdict = "contradicted"
    else:
        verdict = "differs"
    return Outcome(est, verdict, "order", unit=unit, detail=f"ordering holds at {held} of {len(points)} "
                   f"(seed, point) pairs")


# --------------------------------------------------------------------------- papers and results


@dataclass(frozen=True, slots=True)
class Size:
    """A run size: ``quick`` (<= 15 min on 2 cores) or ``full`` (the paper's size, or the largest this
    machine does). ``params``: the scalars the experiments read; ``seeds``: the replicates; ``reduced``:
    what was cut from the paper's size, in words; ``est_cpu_s``: estimated CPU seconds of all cells
    (the printed estimate is this over the workers)."""

    name: Mode
    description: str
    seeds: tuple[int, ...]
    est_cpu_s: float
    params: Mapping[str, Scalar] = field(default_factory=dict)
    reduced: str = ""

    def p(self, key: str) -> Any:
        if key not in self.params:
            raise KeyError(f"size {self.name} has no parameter {key!r}")
        return self.params[key]


class Results:
    """The rows of the experiments run so far: ``rows(name)`` are the successful cells of that
    experiment's grid (this run's cells only, in grid order)."""

    def __init__(self, tables: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> None:
        self._tables: dict[str, list[dict[str, Any]]] = {k: [dict(r) for r in v] for k, v in (tables or {}).items()}

    def add(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self._tables[name] = [dict(r) for r in rows if not r.get("error")]

    def rows(self, name: str, **match: Any) -> list[dict[str, Any]]:
        """The rows of experiment ``name`` whose columns equal ``match``."""
        if name not in self._tables:
            raise KeyError(f"experiment {name!r} has not run")
        return [r for r in self._tables[name] if all(r.get(k) == v for k, v in match.items())]

    def names(self) -> list[str]:
        return list(self._tables)


@dataclass(frozen=True, slots=True)
class Experiment:
    """One grid on the experiment runner, written to ``DIR/<name>.parquet``. ``cells(size, prior)``
    returns the grid (``prior``: the rows of the experiments before it); ``summary(rows)`` (optional)
    renders the table claims.md shows under the experiment's name (the evidence a cause points to)."""

    name: str
    title: str
    cells: Callable[[Size, Results], list[Cell]]
    summary: Callable[[Results], str] | None = None
    batch: int = 1


@dataclass(frozen=True, slots=True)
class Claim:
    """One headline claim: ``id`` (``"000-1"``), the claim in one sentence, where in the paper, the
    paper's figure as printed, what ours measures (``metric``), and the evaluation."""

    id: str
    text: str
    where: str
    paper: str
    metric: str
    evaluate: Callable[[Results], Outcome]


@dataclass(frozen=True, slots=True)
class Paper:
    id: str
    title: str
    source: str
    sizes: Mapping[str, Size]
    experiments: Sequence[Experiment]
    claims: Sequence[Claim]
    notes: str = ""

    def size(self, mode: str) -> Size:
        if mode not in self.sizes:
            raise ValidationError(field="mode", problem=f"paper {self.id} has no {mode!r} size "
                                  f"(it has {', '.join(self.sizes)})")
        return self.sizes[mode]

    def experiment(self, name: str) -> Experiment:
        for e in self.experiments:
            if e.name == name:
                return e
        raise KeyError(name)


def checked(paper: Paper, claim: Claim, out: Outcome) -> Outcome:
    """``out`` with the framework's rules applied: a cause for every verdict but holds, and evidence
    that names experiments of this paper (a module naming an unknown one is a bug: ValueError)."""
    names = {e.name for e in paper.experiments}
    unknown = [e for e in out.evidence if e not in names]
    if unknown:
        raise ValueError(f"claim {claim.id}: evidence {unknown} is not an experiment of paper {paper.id}")
    if out.verdict != "holds" and (not out.cause or not out.evidence):
        return replace(out, cause=out.cause or UNEXPLAINED)
    return out


# ------------------------------------------------------------------------------------- real traces


def trace_dir(needs: Sequence[str]) -> Path:
    """The folder of the real SWF traces: ``$VMCTL_TRACE_DIR``, default ``../shared/data/traces`` (next to the
    repository); ``ValidationError`` naming the files it lacks. Cells name a trace by its file name only
    (resolved here when they run), so a results table holds no path of the machine that made it."""
    d = inputs.trace_dir()
    missing = [t for t in needs if not (d / t).is_file()]
    if missing:
        raise ValidationError(field="VMCTL_TRACE_DIR", problem=f"{d} lacks {', '.join(missing)} (set VMCTL_TRACE_DIR "
                                                               "to the folder of the SWF traces)")
    return d


def trace_path(name: str) -> str:
    """A trace's file name as a cell gives it -> its path on this machine (:func:`trace_dir`)."""
    return str(trace_dir((name,)) / name)

