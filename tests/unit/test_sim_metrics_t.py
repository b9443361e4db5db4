"""The simulator's t quantiles (issue 27: a table instead of a scipy import at the end of every run)
are exactly what scipy computes, and a one-tier run over a trace imports no scipy at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scipy.special import stdtrit

from vmctl.sim import metrics

ROOT = Path(__file__).resolve().parents[2]


def test_t_table_is_scipy_exactly() -> None:
    for df in range(1, 129):
        assert metrics.t_quantile(df, 0.975) == float(stdtrit(df, 0.975)), df
    # outside the table: scipy itself
    assert metrics.t_quantile(200, 0.975) == float(stdtrit(200, 0.975))
    assert metrics.t_quantile(24, 0.95) == float(stdtrit(24, 0.95))


def test_easy_over_a_trace_imports_no_scipy(tmp_path: Path) -> None:
    swf = tmp_path / "t.swf"
    swf.write_text("; MaxProcs: 4\n" + "".join(
        f"{i} {i * 10} 0 {20 + i} {1 + i % 3} -1 -1 {1 + i % 3} {30 + i} -1 1 {i % 4} -1 -1 1 -1 -1 -1\n"
        for i in range(1, 200)))
    code = ("import sys\nfrom vmctl.policies.registry import create_policy\nfrom vmctl.sim.engine import Simulator\n"
            "from vmctl.sim.workloads import read_swf\n"
            f"wl = read_swf({str(swf)!r})\n"
            "r = Simulator(wl.jobs, wl.max_procs, create_policy('easy')).run()\n"
            "assert r.metrics.ci_response is not None\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
