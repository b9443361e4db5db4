"""Paper 002: the methods' default (faster) forms make exactly the decisions of their reference forms
(``make_policy(..., reference=True)``): the same start, finish, width and cluster of every task of seeded
workloads, under light load and overload (HSRET's Sch1 suspensions, hopeless tasks, Checksch's searches
below and above the width of snet), and eq. 8's slot loads bit for bit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from vmctl.policies.moldable import make_policy
from vmctl.policies.moldable.hsret import LoadTable, getnet, slot_loads
from vmctl.policies.moldable.model import Clusters, Profile, SlotView
from vmctl.sim.moldable import MoldableConfig, generate, paper_profiles, run_slots

#: (policy, config) pairs: the paper's profiles on small platforms, loads from light to overloaded
CASES: list[tuple[str, dict[str, Any]]] = [
    ("hsret", {"rate": 6.0, "clusters": 2, "nodes": 200, "slots": 120, "accuracy": 0.9}),
    ("hsret", {"rate": 30.0, "clusters": 3, "nodes": 300, "slots": 80, "seed": 2}),
    ("hsret", {"rate": 12.0, "clusters": 3, "nodes": 300, "slots": 80, "slot": 720.0, "seed": 5}),
    ("hsret-afcfs", {"rate": 30.0, "clusters": 3, "nodes": 300, "slots": 60}),
    ("afcfs", {"rate": 30.0, "clusters": 4, "nodes": 300, "slots": 80, "seed": 3}),
    ("afcfs", {"rate": 8.0, "clusters": 2, "nodes": 200, "slots": 80, "accuracy": 0.9}),
    ("cbsp", {"rate": 30.0, "clusters": 4, "nodes": 300, "slots": 80, "seed": 4}),
    ("all-eft", {"rate": 12.0, "clusters": 3, "nodes": 200, "slots": 20}),
    ("all-eft-cap", {"rate": 12.0, "clusters": 3, "nodes": 200, "slots": 20, "seed": 6}),
]


def outcome(policy: str, kw: dict[str, Any], reference: bool,
            profiles: tuple[Profile, ...] | None = None) -> tuple[dict[str, Any], list[np.ndarray]]:
    cfg = MoldableConfig(policy=policy, **{"slot": 360.0, "warmup": 0, "batches": 2, "drain": 40, **kw,
                                           **({"profiles": profiles} if profiles else {})})
    tasks, clusters = generate(cfg)
    res, out = run_slots(policy, cfg.seed, cfg.slot, tasks, clusters, cfg.profiles, slots=cfg.slots, warm=0,
                         drain=cfg.drain, batches=2, reference=reference)
    assert out is not None
    return res, [out.start, out.finish, out.width, out.cluster]


@pytest.mark.parametrize(("policy", "kw"), CASES, ids=[f"{p}-{i}" for i, (p, _) in enumerate(CASES)])
def test_the_default_form_decides_as_the_reference(policy: str, kw: dict[str, Any]) -> None:
    ref_res, ref = outcome(policy, kw, reference=True)
    res, got = outcome(policy, kw, reference=False)
    assert (ref[0] >= 0).sum() > 50  # the workload did start tasks
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_array_equal(a, b)
    for key in ("aet", "awt", "put", "suspended_task_slots", "hsret_cases", "utilization"):
        assert res[key] == ref_res[key], key


def test_the_cases_cover_suspensions_and_late_tasks() -> None:
    """The overloaded cases above exercise Sch1 and tasks that miss their deadline, so the comparison
    covers those branches too."""
    res, _ = outcome("hsret-afcfs", CASES[3][1], reference=False)
    assert res["suspended_task_slots"] > 0 and res["put"] > 0
    res, _ = outcome("afcfs", CASES[4][1], reference=False)
    assert res["put"] > 0


def test_a_profile_whose_time_grows_by_a_rounding_error_takes_the_reference_step() -> None:
    """A Profile may grow by up to 1e-12 relative from one width to the next; the interval shortcut
    needs times that never grow, so such a profile goes through the reference per-task step, and the
    decisions still match."""
    wrf, grapes = paper_profiles()
    rel = list(grapes.rel)
    rel[3] = rel[2] * (1 + 5e-13)  # grows, within what Profile allows
    bumpy = Profile("bumpy", grapes.widths, tuple(rel))
    assert not bool((np.diff(bumpy.r) <= 0).all())
    kw = {"rate": 20.0, "clusters": 3, "nodes": 300, "slots": 60, "seed": 7}
    for policy in ("hsret", "afcfs"):
        _, ref = outcome(policy, kw, reference=True, profiles=(wrf, bumpy))
        _, got = outcome(policy, kw, reference=False, profiles=(wrf, bumpy))
        for a, b in zip(ref, got, strict=True):
            np.testing.assert_array_equal(a, b)


def test_the_load_table_gives_eq_8_bit_for_bit() -> None:
    rng = np.random.default_rng(11)
    wrf, grapes = paper_profiles()
    k = 400
    arrival = np.sort(rng.uniform(0, 20_000, k))
    length = rng.uniform(500, 9500, k)
    deadline = arrival + rng.uniform(1.5, 5, k) * length
    profile = rng.integers(0, 2, k)
    e_f = np.zeros(0)
    view = SlotView(now=50, slot=360.0, clusters=Clusters((100, 80), (1.1, 0.9)), profiles=(wrf, grapes),
                    w_id=np.arange(k), w_arrival=arrival, w_deadline=deadline, w_length=length,
                    w_profile=profile, a_id=np.zeros(0, dtype=np.int64), a_arrival=e_f, a_deadline=e_f,
                    a_length=e_f, a_profile=np.zeros(0, dtype=np.int64), a_cluster=np.zeros(0, dtype=np.int64),
                    a_width=np.zeros(0, dtype=np.int64), a_rem=np.zeros(0, dtype=np.int64))
    table = LoadTable(view)
    for snet in (0.0, 0.03, 0.2, 0.5, 0.77, 1.0):
        ref = slot_loads(view, snet)
        got = slot_loads(view, snet, table)
        assert ref.dtype == got.dtype and ref.shape == got.shape
        assert ref.tobytes() == got.tobytes()
    assert getnet(view, 1.0) == getnet(view, 1.0, table)


def test_make_policy_builds_the_reference_forms() -> None:
    rng = np.random.default_rng(1)
    for name in ("hsret", "hsret-afcfs", "afcfs", "all-eft", "all-eft-cap", "cbsp"):
        assert vars(make_policy(name, rng, reference=True))["reference"] is True
        assert vars(make_policy(name, rng))["reference"] is False
