"""Paper 003: VCSCHED, resource allocation using virtual clusters (Casanova et al., RR-6692; seeds/003_*.txt).

The headline claims of sec. 4.2 (MCB1-8, Table 1 and Fig. 7; small problems, Figs. 11-14; large problems,
Figs. 15-18) and sec. 5.2 (parallel jobs, Figs. 19-22), on the instance suites of ``vmctl vcsched eval``
(:mod:`vmctl.experiments.vcsched`: its cells, ``eval_cell``, one per instance and algorithm):

- ``small``: 4 hosts, 6-12 tasks, slack 0.1-0.9, CVs 0.25/0.75, every algorithm including the exact MILP;
- ``large``: 64 hosts, 100/250/500 tasks, every heuristic against the LP bound (RRND/RRNZ at 100 tasks only,
  as in docs/vcsched.md);
- ``parallel``: as ``large`` with parallel jobs (Lublin-Feitelson sizes), SG and MCB8.

Seeds: each seed is another set of generated instances (``SeedSequence([seed, spec..., k])``; the paper's
set is one draw, ours start at 2008 as ``vmctl vcsched eval``). Per seed, a claim's number is computed
over all the instances of that seed, then the interval is over seeds.

Readings: "% below MILP" (bound) is the mean relative gap of the minimum yield, ``100 (MILP - alg) / MILP``,
over the instances both solved (as ``vmctl vcsched eval``'s tables); "% degradation from best" is the paper's
Table 1 measure over MCB1-8 (:func:`vmctl.experiments.vcsched.degradation`). Where the paper writes "about
X %" we read X +- 1 point (the ``value`` rule's tolerance); "11 % to 13 %" is 12 +- 1. A failure is an
instance the algorithm placed no allocation for; "feasible" instances are those the MILP solved.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from vmctl.experiments.runner import Cell
from vmctl.experiments.vcsched import MCBS, SUITES, degradation, eval_cells, jobs_for
from vmctl.reproduce.base import (
    Claim,
    Estimate,
    Experiment,
    Outcome,
    Paper,
    Results,
    Size,
    compare_order,
    compare_value,
)

GREEDY = ("gr", "sg", "gb", "sgb")
HEURISTICS = ("rrnd", "rrnz", "gr", "sg", "gb", "sgb", *MCBS)

SIZES = {
    # measured here (docs/vcsched.md): MILP 0.05 / 0.24 / 1.4 / 3.4 s at 6 / 8 / 10 / 12 tasks; a large instance
    # with all heuristics ~0.6 s; a parallel one ~0.03 s (times x2-3 under the shared machine's load)
    "quick": Size("quick", "1 instance per specification and seed, slacks 0.1/0.2/0.3/0.5/0.7/0.9, small problems "
                  "with 6-10 tasks, large and parallel ones with 100 and 500 tasks, 3 instance seeds (216 small, "
                  "144 large, 144 parallel instances)", seeds=(2008, 2009, 2010), est_cpu_s=700.0,
                  params={"small_n": 1, "large_n": 1, "parallel_n": 1, "small_tasks": "6,8,10",
                          "large_tasks": "100,500", "parallel_tasks": "100,500", "slacks": "0.1,0.2,0.3,0.5,0.7,0.9"},
                  reduced="the paper: 10 instances per specification for small problems (1,440, up to 12 tasks), "
                          "100 for large and parallel ones (10,800 each, also 250 tasks), 9 slacks; one instance "
                          "set"),
    "full": Size("full", "the paper's instance counts (10 per small, 100 per large and parallel specification), "
                 "3 instance seeds", seeds=(2008, 2009, 2010), est_cpu_s=3 * (13 * 60 * 2 + 60 * 60 * 2 + 161 * 2),
                 params={"small_n": 10, "large_n": 100, "parallel_n": 100, "small_tasks": "6,8,10,12"},
                 reduced="three instance sets instead of the paper's one (for the intervals)"),
}


def _suite_cells(suite: str) -> Callable[[Size, Results], list[Cell]]:
    """The suite's cells for every seed: ``{suite}_n`` instances per specification, and optionally only the
    task counts ``{suite}_tasks`` and the slacks ``slacks`` (comma-separated) of the size's params."""
    def cells(size: Size, prior: Results) -> list[Cell]:
        ts = size.params.get(f"{suite}_tasks")
        sl = size.params.get("slacks")
        tasks = [int(t) for t in str(ts).split(",")] if ts else None
        slacks = [float(x) for x in str(sl).split(",")] if sl else None
        out: list[Cell] = []
        for seed in size.seeds:
            out += eval_cells(jobs_for(suite, int(size.p(f"{suite}_n")), seed, 60.0, None, 100, tasks, slacks))
        return out
    return cells


# ------------------------------------------------------------------------------------------ reading


def _solved(r: dict[str, Any]) -> bool:
    return bool(r.get("placed")) and r["status"] != "skipped"


def _inst(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["tasks"], r["slack"], r["cv_mem"], r["cv_cpu"], r["k"])


def _by_seed(res: Results, suite: str) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in res.rows(suite):
        out[int(r["seed"])].append(r)
    return dict(sorted(out.items()))


def _gap_to(rows: Sequence[dict[str, Any]], alg: str, ref: str) -> float:
    """Mean % of the minimum yield below ``ref`` (``"milp"`` or ``"bound"``) over the instances both solved."""
    refs = ({_inst(r): r["min_yield"] for r in rows if r["algorithm"] == "milp" and _solved(r)} if ref == "milp"
            else {_inst(r): r["lp_bound"] for r in rows if r.get("lp_bound")})
    gaps = [100.0 * (refs[_inst(r)] - r["min_yield"]) / refs[_inst(r)] for r in rows
            if r["algorithm"] == alg and _solved(r) and refs.get(_inst(r), 0) > 0]
    return statistics.fmean(gaps) if gaps else float("nan")


def _per_seed(res: Results, suite: str, f: Callable[[list[dict[str, Any]]], float]) -> list[float]:
    return [f(rows) for rows in _by_seed(res, suite).values()]


def _deg(rows: list[dict[str, Any]], alg: str) -> float:
    return degradation(rows, MCBS)[alg][0]


def value_claim(suite: str, f: Callable[[list[dict[str, Any]]], float], paper: float, tolerance: float,
                cause: Callable[[Results, Outcome], Outcome] | None = None, unit: str = "%") -> Callable[
                    [Results], Outcome]:
    def evaluate(res: Results) -> Outcome:
        out = compare_value(paper, _per_seed(res, suite, f), unit=unit, tolerance=tolerance)
        if tolerance:
            out = out.noting(f"paper read as {paper:g} +- {tolerance:g}")
        return out if out.verdict == "holds" or cause is None else cause(res, out)
    return evaluate


def order_claim(suite: str, f: Callable[[list[dict[str, Any]]], list[float]], unit: str,
                cause: Callable[[Results, Outcome], Outcome] | None = None) -> Callable[[Results], Outcome]:
    def evaluate(res: Results) -> Outcome:
        out = compare_order({s: f(rows) for s, rows in _by_seed(res, suite).items()}, unit=unit)
        return out if out.verdict == "holds" or cause is None else cause(res, out)
    return evaluate


def _by_slack(rows: Sequence[dict[str, Any]]) -> dict[float, list[dict[str, Any]]]:
    out: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[float(r["slack"])].append(r)
    return dict(sorted(out.items()))


def _mean_of(rows: Sequence[dict[str, Any]], alg: str, field: str, solved: bool = True) -> float:
    xs = [float(r[field]) for r in rows if r["algorithm"] == alg and (_solved(r) or not solved)
          and r["status"] != "skipped"]
    return statistics.fmean(xs) if xs else float("nan")


def _fail_rate(rows: Sequence[dict[str, Any]], alg: str, where: Callable[[dict[str, Any]], bool] = lambda r: True
               ) -> float:
    rs = [r for r in rows if r["algorithm"] == alg and r["status"] != "skipped" and where(r)]
    return 100.0 * sum(1 for r in rs if not _solved(r)) / len(rs) if rs else float("nan")


# claims' measures, one number (value) or a list of margins (order) per seed's rows

def mcb_order_margins(rows: list[dict[str, Any]]) -> list[float]:
    deg = degradation(rows, MCBS)
    return [min(deg[a][0] for a in MCBS[:4]) - max(deg[a][0] for a in MCBS[4:])]


def mcb8_best_margins(rows: list[dict[str, Any]]) -> list[float]:
    deg = degradation(rows, MCBS)
    return [deg[a][0] - deg["mcb8"][0] for a in MCBS if a != "mcb8"]


def rr_margins(rows: list[dict[str, Any]]) -> list[float]:
    others = max(_gap_to(rows, a, "milp") for a in (*GREEDY, "mcb8"))
    return [_gap_to(rows, a, "milp") - others for a in ("rrnd", "rrnz")]


def feasible_failures(rows: list[dict[str, Any]]) -> float:
    feasible = {_inst(r) for r in rows if r["algorithm"] == "milp" and _solved(r)}
    return float(sum(1 for r in rows if r["algorithm"] in ("gb", "sgb") and _inst(r) in feasible and not _solved(r)))


def large_mcb8_margins(rows: list[dict[str, Any]]) -> list[float]:
    m = _gap_to(rows, "mcb8", "bound")
    return [_gap_to(rows, a, "bound") - m for a in HEURISTICS if a != "mcb8"
            if any(r["algorithm"] == a and _solved(r) for r in rows)]


def greedy_gap_above_02(rows: list[dict[str, Any]]) -> float:
    rs = [r for r in rows if r["slack"] > 0.2 + 1e-9]
    return statistics.fmean(_gap_to(rs, a, "bound") for a in GREEDY)


def mcb8_gap_at(slack: float) -> Callable[[list[dict[str, Any]]], float]:
    return lambda rows: _gap_to([r for r in rows if abs(r["slack"] - slack) < 1e-9], "mcb8", "bound")


def gr_gb_diff(rows: list[dict[str, Any]]) -> float:
    return abs(_gap_to(rows, "gr", "bound") - _gap_to(rows, "gb", "bound"))


def rrnd_low_slack_failures(rows: list[dict[str, Any]]) -> float:
    return _fail_rate(rows, "rrnd", lambda r: r["slack"] < 0.4 - 1e-9)


def mcb_time_margins(rows: list[dict[str, Any]]) -> list[float]:
    big = [r for r in rows if r["tasks"] == 500]
    return [0.5 - _mean_of(big, a, "time_s", solved=False) for a in MCBS]


def parallel_margins(field: str, sign: float) -> Callable[[list[dict[str, Any]]], list[float]]:
    def f(rows: list[dict[str, Any]]) -> list[float]:
        out = []
        for rs in _by_slack(rows).values():
            both = {_inst(r) for r in rs if r["algorithm"] == "sg" and _solved(r)} & {
                _inst(r) for r in rs if r["algorithm"] == "mcb8" and _solved(r)}
            sub = [r for r in rs if _inst(r) in both]
            if sub:
                out.append(sign * (_mean_of(sub, "mcb8", field) - _mean_of(sub, "sg", field)))
        return out
    return f


def fail_diff(rows: list[dict[str, Any]]) -> float:
    return _fail_rate(rows, "mcb8") - _fail_rate(rows, "sg")


def sg_speedup(rows: list[dict[str, Any]]) -> float:
    big = [r for r in rows if r["tasks"] == 500]
    return _mean_of(big, "mcb8", "time_s", solved=False) / _mean_of(big, "sg", "time_s", solved=False)


# causes: each reads the experiments and names them


def cause_mcb8_large(res: Results, out: Outcome) -> Outcome:
    per = _by_seed(res, "large")
    maxima = [degradation(rows, MCBS)["mcb8"][1] for rows in per.values()]
    n = [degradation(rows, MCBS)["mcb8"][2] for rows in per.values()]
    return out.because(f"MCB8's average degradation is carried by a few outliers: its maximum per seed is "
                       f"{', '.join(f'{m:.1f} %' for m in maxima)} over {', '.join(map(str, n))} solved instances "
                       "(large); one such instance in a sample moves the average by a tenth of a point (the "
                       "paper's maximum is 3.16 %)", "large")


def cause_greedy_large(res: Results, out: Outcome) -> Outcome:
    per = [_by_slack([r for r in rows if r["slack"] > 0.2 + 1e-9]) for rows in _by_seed(res, "large").values()]
    slacks = sorted(per[0])
    text = ", ".join(f"{s:g}: {statistics.fmean(_gap_to(p[s], a, 'bound') for p in per for a in GREEDY):.1f} %"
                     for s in slacks)
    return out.because(f"the greedy gap to the LP bound by slack (large, mean of GR/SG/GB/SGB): {text}; the paper "
                       "reads 'about 20 %' off its Fig. 15 curves; the generator's redraw of values outside (0, 1] "
                       "(docs/vcsched.md) changes the instances' spread, which we did not vary", "large")


def cause_mcb8_slack(res: Results, out: Outcome) -> Outcome:
    rows = [r for rs in _by_seed(res, "large").values() for r in rs if abs(r["slack"] - 0.2) < 1e-9]
    by_tasks = {t: _gap_to([r for r in rows if r["tasks"] == t], "mcb8", "bound")
                for t in sorted({r["tasks"] for r in rows})}
    fails = _fail_rate(rows, "mcb8")
    return out.because("MCB8's gap at slack 0.2 by task count: " + ", ".join(f"{t} tasks {g:.1f} %" for t, g in
                                                                             by_tasks.items())
                       + f", failing {fails:.0f} % of them (large): the average is over the instances MCB8 solved, "
                       "and at slack 0.2 that set depends on the sample", "large")


def cause_speedup(res: Results, out: Outcome) -> Outcome:
    big = [r for rs in _by_seed(res, "parallel").values() for r in rs if r["tasks"] == 500]
    sg_ms = 1000 * _mean_of(big, "sg", "time_s", solved=False)
    return out.because(f"our times include the per-job average-yield pass, an LP for parallel jobs (docs/vcsched.md); "
                       f"SG with it takes {sg_ms:.1f} ms at 500 tasks (parallel), so the LP, not the placement, "
                       "dominates SG's time and the ratio shrinks", "parallel")


def cause_mcb_rank(suite: str) -> Callable[[Results, Outcome], Outcome]:
    def cause(res: Results, out: Outcome) -> Outcome:
        parts = []
        for seed, rows in _by_seed(res, suite).items():
            deg = degradation(rows, MCBS)
            order = sorted(MCBS, key=lambda a: deg[a][0])
            parts.append(f"seed {seed}: " + " < ".join(f"{a.upper()} {deg[a][0]:.2f}" for a in order[:5]))
        n = statistics.fmean(len({_inst(r) for r in rows}) for rows in _by_seed(res, suite).values())
        return out.because(f"the ranking by average degradation changes from seed to seed ({'; '.join(parts)}; "
                           f"{suite}): over {n:.0f} instances per seed the leading MCBs differ by less than one "
                           "instance's outlier moves the average (the paper's set is 1,440 / 10,800 instances)", suite)
    return cause


def cause_by_tasks(alg: Sequence[str]) -> Callable[[Results, Outcome], Outcome]:
    """The gap to the MILP grows with the task count: the quick size stops at 10 tasks."""
    def cause(res: Results, out: Outcome) -> Outcome:
        rows = [r for rs in _by_seed(res, SMALL).values() for r in rs]
        tasks = sorted({r["tasks"] for r in rows})
        gaps = {t: statistics.fmean(_gap_to([r for r in rows if r["tasks"] == t], a, "milp") for a in alg)
                for t in tasks}
        return out.because("the gap to the MILP by task count: " + ", ".join(f"{t} tasks {g:.1f} %" for t, g in
                                                                            gaps.items())
                           + " (small): it depends on the task counts run (the paper's set has 6-12 tasks) and "
                           "on the instance sample", SMALL)
    return cause


def cause_heuristics(res: Results, out: Outcome) -> Outcome:
    per = _by_seed(res, LARGE)
    gaps = {a: statistics.fmean(_gap_to(rows, a, "bound") for rows in per.values()) for a in HEURISTICS}
    close = [a for a in HEURISTICS if a != "mcb8" and gaps[a] <= gaps["mcb8"]]
    return out.because(f"MCB8 ({gaps['mcb8']:.1f} % below the bound) is matched or beaten on average by "
                       + ", ".join(f"{a.upper()} ({gaps[a]:.1f} %)" for a in close)
                       + " (large): the other descending MCBs are within a few tenths of MCB8; against GR, SG, GB, "
                       "SGB, RRND and RRNZ the ordering holds", LARGE)


def cause_avg_yield(res: Results, out: Outcome) -> Outcome:
    parts = []
    for seed, rows in _by_seed(res, PAR).items():
        for slack, rs in _by_slack(rows).items():
            d = _mean_of(rs, "sg", "avg_yield") - _mean_of(rs, "mcb8", "avg_yield")
            if d <= 0:
                parts.append(f"seed {seed} slack {slack:g} ({d:+.3f})")
    return out.because("SG's average yield is not above MCB8's at " + ", ".join(parts) + " (parallel): at high "
                       "slack both reach yields near 1 and the difference vanishes", PAR)


# ------------------------------------------------------------------------------------------ summaries


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def _ci(xs: Sequence[float], digits: int = 2) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "-"
    e = Estimate.of(xs)
    return f"{e.mean:.{digits}f}" if e.n == 1 else f"{e.mean:.{digits}f} ± {e.hi - e.mean:.{digits}f}"


def summary(suite: str) -> Callable[[Results], str]:
    def render(res: Results) -> str:
        per = _by_seed(res, suite)
        algs = [a for a in ("milp", *HEURISTICS) if any(r["algorithm"] == a for rows in per.values() for r in rows)]
        out = []
        for a in algs:
            out.append([a, _ci([_fail_rate(rows, a) for rows in per.values()], 1),
                        _ci([_mean_of(rows, a, "min_yield") for rows in per.values()], 3),
                        _ci([_mean_of(rows, a, "avg_yield") for rows in per.values()], 3),
                        _ci([_gap_to(rows, a, "milp") for rows in per.values()], 1) if suite == "small" else "-",
                        _ci([_gap_to(rows, a, "bound") for rows in per.values()], 1),
                        _ci([_deg(rows, a) for rows in per.values()], 2) if a in MCBS else "-",
                        _ci([1000 * _mean_of(rows, a, "time_s", solved=False) for rows in per.values()], 1)])
        n = {s: len({_inst(r) for r in rows}) for s, rows in per.items()}
        return (f"Instances per seed: {n}. Mean over seeds ± half width of the 95 % interval; yields over the solved "
                "instances, gaps over the instances both solved.\n\n"
                + _table(["algorithm", "failure %", "min yield", "avg yield", "% below MILP", "% below LP bound",
                          "% degradation from best MCB", "mean ms"], out))
    return render


SMALL, LARGE, PAR = "small", "large", "parallel"

PAPER = Paper(
    id="003",
    title="VCSCHED: resource allocation using virtual clusters",
    source="shared/seeds/003_bd3e63c4ab978064.txt",
    sizes=SIZES,
    experiments=[
        Experiment(SMALL, "small problems: 4 hosts, 6-12 tasks, every algorithm and the MILP (Figs. 2-5, 11-14)",
                   _suite_cells(SMALL), summary=summary(SMALL),
                   batch=len(SUITES[SMALL].algorithms)),
        Experiment(LARGE, "large problems: 64 hosts, 100-500 tasks, heuristics and the LP bound (Figs. 6-10, 15-18)",
                   _suite_cells(LARGE), summary=summary(LARGE), batch=len(SUITES[LARGE].algorithms)),
        Experiment(PAR, "parallel jobs: 64 hosts, Lublin-Feitelson sizes, SG and MCB8 (Figs. 19-22)",
                   _suite_cells(PAR), summary=summary(PAR), batch=len(SUITES[PAR].algorithms)),
    ],
    claims=[
        Claim("003-1", "MCB8 has the lowest average % degradation from best of MCB1-8 (small)", "sec. 4.2.1, Table 1",
              "lowest", "other MCB's average degradation minus MCB8's", order_claim(SMALL, mcb8_best_margins,
                                                                                     "points of degradation",
                                                                                     cause_mcb_rank(SMALL))),
        Claim("003-2", "MCB8's average % degradation from best (small)", "sec. 4.2.1, Table 1", "1.06 %",
              "mean over instances, per seed",
              value_claim(SMALL, lambda rows: _deg(rows, "mcb8"), 1.06, 0.0, cause_mcb_rank(SMALL))),
        Claim("003-3", "The four MCBs sorting tasks by descending size (MCB5-8) beat the ascending ones (MCB1-4)",
              "sec. 4.2.1, Table 1", "yes", "best ascending MCB's degradation minus worst descending one's (small)",
              order_claim(SMALL, mcb_order_margins, "points of degradation", cause_mcb_rank(SMALL))),
        Claim("003-4", "MCB8 is the best MCB on large problems", "sec. 4.2.1, Fig. 7", "lowest",
              "other MCB's average degradation minus MCB8's (large)",
              order_claim(LARGE, mcb8_best_margins, "points of degradation", cause_mcb_rank(LARGE))),
        Claim("003-5", "MCB8's average % degradation from best (large)", "sec. 4.2.1, Fig. 7", "0.09 %",
              "mean over instances, per seed",
              value_claim(LARGE, lambda rows: _deg(rows, "mcb8"), 0.09, 0.0, cause_mcb8_large)),
        Claim("003-6", "The LP bound is about 4 % above the MILP's minimum yield (small)", "sec. 4.2.2, Fig. 11",
              "about 4 %", "mean % of the MILP's minimum yield below the LP bound",
              value_claim(SMALL, lambda rows: _gap_to(rows, "milp", "bound"), 4.0, 1.0, cause_by_tasks(("milp",)))),
        Claim("003-7", "The exact MILP is about 2 % better than MCB8 (small)", "sec. 4.2.2, Fig. 11", "about 2 %",
              "MCB8's mean % below the MILP", value_claim(SMALL, lambda rows: _gap_to(rows, "mcb8", "milp"), 2.0, 1.0,
                                                                  cause_by_tasks(("mcb8",)))),
        Claim("003-8", "The exact MILP is 11-13 % better than the greedy algorithms (small)", "sec. 4.2.2, Fig. 11",
              "11-13 %", "mean % below the MILP of GR, SG, GB, SGB",
              value_claim(SMALL, lambda rows: statistics.fmean(_gap_to(rows, a, "milp") for a in GREEDY), 12.0, 1.0,
                          cause_by_tasks(GREEDY))),
        Claim("003-9", "RRND and RRNZ are markedly poorer than the other algorithms (small)", "sec. 4.2.2, Fig. 11",
              "yes", "RRND's / RRNZ's % below MILP minus the worst of the greedy and MCB8",
              order_claim(SMALL, rr_margins, "points below the MILP")),
        Claim("003-10", "Of the feasible instances GB and SGB never fail (small)", "sec. 4.2.2, Fig. 13", "0 failures",
              "GB + SGB failures on instances the MILP solved", value_claim(SMALL, feasible_failures, 0.0, 0.0,
                                                                            unit="failures")),
        Claim("003-11", "MCB8 achieves far better minimum yields than any other heuristic (large)",
              "sec. 4.2.3, Fig. 15", "yes", "other heuristic's % below the LP bound minus MCB8's",
              order_claim(LARGE, large_mcb8_margins, "points below the bound", cause_heuristics)),
        Claim("003-12", "MCB8 is only 8 % away from the LP bound at slack 0.2 (large)", "sec. 4.2.3, Fig. 15", "8 %",
              "MCB8's mean % below the bound at slack 0.2",
              value_claim(LARGE, mcb8_gap_at(0.2), 8.0, 1.0, cause_mcb8_slack)),
        Claim("003-13", "The greedy algorithms are on average 20 % below the LP bound for slack > 0.2 (large)",
              "sec. 4.2.3, Fig. 15", "about 20 %", "mean % below the bound of GR, SG, GB, SGB at slack 0.3-0.9",
              value_claim(LARGE, greedy_gap_above_02, 20.0, 1.0, cause_greedy_large)),
        Claim("003-14", "GR and GB perform nearly identically (large)", "sec. 4.2.3, Fig. 15", "nearly identical",
              "|GR - GB| in % below the bound (read: within 1 point)",
              value_claim(LARGE, gr_gb_diff, 0.0, 1.0, unit="points")),
        Claim("003-15", "RRND solves no instance with slack below 0.4 (large)", "sec. 4.2.3, Fig. 17", "100 % fail",
              "RRND's failure rate at slack 0.1-0.3 (100 tasks)",
              value_claim(LARGE, rrnd_low_slack_failures, 100.0, 0.0)),
        Claim("003-16", "The MCB algorithms take under half a second for 500 tasks (large)", "sec. 4.2.1, Fig. 10",
              "< 0.5 s", "0.5 s minus each MCB's mean time at 500 tasks",
              order_claim(LARGE, mcb_time_margins, "s under 0.5 s")),
        Claim("003-17", "Parallel jobs: MCB8's minimum yield is significantly better than SG's", "sec. 5.2, Fig. 19",
              "yes", "MCB8 - SG mean minimum yield per slack (instances both solved)",
              order_claim(PAR, parallel_margins("min_yield", 1.0), "yield")),
        Claim("003-18", "Parallel jobs: SG achieves a higher average yield than MCB8", "sec. 5.2, Fig. 20", "yes",
              "SG - MCB8 mean average yield per slack (instances both solved)",
              order_claim(PAR, parallel_margins("avg_yield", -1.0), "yield", cause_avg_yield)),
        Claim("003-19", "Parallel jobs: MCB8 and SG have identical failure rates", "sec. 5.2, Fig. 21", "identical",
              "MCB8's failure rate minus SG's (points; read: within 1)",
              value_claim(PAR, fail_diff, 0.0, 1.0, unit="points")),
        Claim("003-20", "Parallel jobs: SG is about 32x faster than MCB8 at 500 tasks", "sec. 5.2, Fig. 22", "~32x",
              "MCB8's mean time / SG's at 500 tasks", value_claim(PAR, sg_speedup, 32.0, 1.0, cause_speedup, unit="x")),
    ],
    notes="Run times are wall times on a 2-core machine shared with other work; the paper's are on a 2008 Xeon "
          "with GLPK. Our times include the average-yield pass, the paper's exclude it.",
)
