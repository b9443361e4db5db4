"""vmctld models a bg job's progress with the simulator's progress model (``vmctl.progress``, MEASY sec.
3.2) fed with the fg utilization its agents measure: ``beta * min(1, (1 - u_fg) / u_bg)``, nothing above
the 96 % threshold, full pace on a core whose fg slot is idle; beta is the model's expected value for the
job's size (the simulator draws it per job)."""

from __future__ import annotations

import numpy as np
import pytest

from vmctl.daemon.state import PROGRESS, ClusterState
from vmctl.daemon.view import build_view
from vmctl.nodedoc import NodeObserved, PowerState, VmObserved
from vmctl.progress import ProgressModel
from vmctl.store.base import JobRecord, NodeRecord, Slot


def _state(fg_usage: float | None, bg_usage: tuple[float, ...], fg_report: float | None = None) -> ClusterState:
    st = ClusterState()
    st.load([], [NodeRecord(name="n1", cores=2)], [], {})
    procs = len(bg_usage)
    bg = JobRecord(id="b", seq=2, name="b", spec={"procs": procs, "estimate": 1000.0, "cpu_usage": list(bg_usage)},
                   state="running", submit_time=0.0, start_time=0.0,
                   slots=[Slot("n1", c, 1) for c in range(procs)], run=1, tier_since=0.0)
    st.jobs["b"] = bg
    st.reindex(bg)
    if fg_usage is not None:
        fg = JobRecord(id="f", seq=1, name="f", spec={"procs": 1, "estimate": 1000.0, "cpu_usage": [fg_usage]},
                       state="running", submit_time=0.0, start_time=0.0, slots=[Slot("n1", 0, 0)],
                       run=1, tier_since=0.0)
        st.jobs["f"] = fg
        st.reindex(fg)
    if fg_report is not None:
        st.set_observed(NodeObserved(node="n1", generation_applied=1, cores=2, vms=(
            VmObserved(name="jf-r1-p0", power=PowerState.RUNNING, utilization=fg_report),)))
    return st


def _both(st: ClusterState) -> tuple[float, float]:
    """The pace from ``pace`` and the progress the view reports after 100 s (two code paths)."""
    view, _lay = build_view(st, 100.0)
    return st.pace(st.jobs["b"]), view.running["b"].progress / 100.0


def test_bg_pace_is_the_shared_model_with_the_measured_fg_utilization() -> None:
    beta = PROGRESS.expected_beta(1)
    assert beta == pytest.approx(0.86)
    # fg estimated at 0.5 until its agent reports; the bg process needs 0.8 of a core
    for pace in _both(_state(0.5, (0.8,))):
        assert pace == pytest.approx(beta * 0.5 / 0.8)
    # the agent measured 0.3: the bg process gets all it needs (0.7 >= 0.6), at beta
    for pace in _both(_state(0.5, (0.6,), fg_report=0.3)):
        assert pace == pytest.approx(beta)
    # above the 96 % threshold the bg VM makes no progress (the old 1 - u rule gave 0.03)
    for pace in _both(_state(0.5, (1.0,), fg_report=0.97)):
        assert pace == 0.0


def test_idle_fg_slot_gives_full_pace_and_the_slowest_process_sets_the_job_pace() -> None:
    for pace in _both(_state(None, (1.0,))):
        assert pace == 1.0
    # two processes: core 0 under a fg job at 0.5, core 1 idle; the job runs at core 0's pace
    beta = PROGRESS.expected_beta(2)
    for pace in _both(_state(0.5, (1.0, 1.0))):
        assert pace == pytest.approx(beta * 0.5)


def test_expected_beta_is_the_mean_of_what_the_simulator_draws() -> None:
    model = ProgressModel()
    _loss, beta = model.draw(7, np.array([4] * 200_000))
    assert model.expected_beta(4) == pytest.approx(float(np.mean(beta)), abs=1e-3)
    _loss, single = model.draw(7, np.array([1] * 200_000))
    assert model.expected_beta(1) == pytest.approx(float(np.mean(single)), abs=1e-3)
