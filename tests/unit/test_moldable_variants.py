"""Issue 26's HSRET readings: the load target, HSRET starting from AFCFS's list (sec. 6.2.2) and the
load-capped ALL-EFT, on cases small enough to check by hand (the module headers' tiny examples)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_moldable_algorithms import P124, starts, view
from vmctl.errors import ValidationError
from vmctl.policies.moldable import HSRET, AllEFT, make_policy
from vmctl.policies.moldable.hsret import getnet, load_case, select_net
from vmctl.policies.moldable.model import Profile
from vmctl.sim.moldable import MoldableConfig, simulate


def test_the_load_target_moves_getnet() -> None:
    # hsret.py's tiny example: TP 1.25, loads 0.8 / 0.96 / 1.28 at widths 1 / 2 / 4
    v = view(0, 10.0, [1], [1.25], [P124], waiting=[(0.0, 100.0, 100.0, 0)])
    assert P124.index_for_net(getnet(v, 1.0)) == 1      # 0.96 <= 1: width 2
    assert P124.index_for_net(getnet(v, 0.9)) == 0      # 0.96 > 0.9: width 1 (0.8)
    assert load_case(v, 0.7)[0] == 2                    # even width 1 (0.8) is above 0.7: Case 2
    assert select_net(v, 0.7) == (2, 1.0)
    assert load_case(v, 1.5)[0] == 1                    # width 4 (1.28) is below 1.5: Case 1
    with pytest.raises(ValidationError) as exc:
        HSRET(target=0.0)
    assert exc.value.fields["field"] == "target"
    with pytest.raises(ValidationError) as exc:
        make_policy("cbsp", np.random.default_rng(1), target=0.9)
    assert exc.value.fields["field"] == "target"


def test_hsret_afcfs_start_keeps_afcfs_list_and_widens_it() -> None:
    # one cluster of 8 free nodes, slot 10; profile widths (2, 4, 8), times 100 / 50 / 30 (net 1, 2/7, 0)
    p = Profile("p", (2, 4, 8), (100.0, 50.0, 30.0))
    # A: length 100, deadline 60: width 2 (10 slots) misses, width 4 (5 slots) meets -> AFCFS width 4
    # B: length 100, deadline 200: width 2 meets -> AFCFS width 2; light load (TP 8): snet 0, width 8
    v = view(0, 10.0, [8], [1.0], [p], waiting=[(0.0, 60.0, 100.0, 0), (0.0, 200.0, 100.0, 0)])
    assert select_net(v)[1] == 0.0
    plain = starts(HSRET().decide(v))
    assert plain == [(0, 0, 8)]                         # EDF Selet: A at snet's width 8 takes the cluster
    out = starts(HSRET(start="afcfs").decide(v))
    # AFCFS's list: A at 4, B at 2 (2 nodes left); widened earliest deadline first: A 4 -> 4 (needs 8,
    # only 6 available), B 2 -> 4 with the 2 free nodes
    assert sorted(out) == [(0, 0, 4), (1, 0, 4)]
    assert HSRET(start="afcfs").name == "hsret-afcfs"
    with pytest.raises(ValidationError):
        HSRET(start="fifo")


def test_capped_all_eft_stays_within_the_load() -> None:
    # 4 nodes of speed 0.3125: TP 1.25 as above, so at target 0.9 the load allows width 1 only; the free
    # nodes would allow 4, which the literal ALL-EFT takes (the shortest run)
    v = view(0, 10.0, [4], [0.3125], [P124], waiting=[(0.0, 100.0, 100.0, 0)])
    literal = starts(AllEFT().decide(v))
    capped = starts(AllEFT(cap=True, target=0.9).decide(v))
    assert literal == [(0, 0, 4)]
    assert [w for _t, _c, w in capped] == [1]


@pytest.mark.parametrize("policy", ["hsret-afcfs", "all-eft-cap"])
def test_the_variants_pass_the_simulators_invariant_checks(policy: str) -> None:
    res = simulate(MoldableConfig(policy=policy, slot=360.0, rate=4.0, slots=40, clusters=2, nodes=64, warmup=5,
                                  seed=3, target=0.9))
    assert res["tasks"] > 0 and res["unfinished"] == 0
    assert 0 < res["utilization"] <= 1.0
