"""A policy declares what it needs of the cluster (levels, discipline, shapes, shared VMs); the
simulator and vmctld refuse one whose needs they do not meet, with a clear error."""

from __future__ import annotations

from typing import ClassVar

import pytest

from vmctl.daemon.config import DAEMON_OFFER, parse_config
from vmctl.errors import ConfigError, PolicyNeedsUnmet
from vmctl.model import ClusterView, Decision, Discipline
from vmctl.policies.base import Needs, Offer, SchedulingPolicy
from vmctl.policies.registry import create_policy
from vmctl.sim.engine import SIM_OFFER, Simulator
from vmctl.sim.workloads.core import WorkloadJob


class Gang(SchedulingPolicy):
    name: ClassVar[str] = "gang-test"
    needs: ClassVar[Needs] = Needs(levels=5, disciplines=frozenset({Discipline.TIMESLICE}),
                                   shapes=frozenset({"rigid", "moldable"}))

    def decide(self, view: ClusterView, now: float) -> Decision:
        return Decision()


def test_declared_needs_of_the_families() -> None:
    assert create_policy("measy").needs.two_tier and not create_policy("easy").needs.two_tier
    assert create_policy("vcsched-mcb8").needs.shared_vms
    for name in ("easy", "measy", "keasy", "vcsched-mcb8"):
        DAEMON_OFFER.check(create_policy(name))
    SIM_OFFER.check(create_policy("measy"))


def test_offer_names_every_unmet_need() -> None:
    with pytest.raises(PolicyNeedsUnmet) as exc:
        Offer(where="cluster x", levels=2, discipline=Discipline.PRIORITY).check(Gang())
    msg = str(exc.value)
    assert msg.startswith("policy gang-test cannot run on cluster x: needs 5 VM levels per core (it has 2)")
    assert "the timeslice discipline (it has priority)" in msg and "job shapes moldable (it has rigid)" in msg
    assert exc.value.reference == "policy-needs-unmet" and exc.value.hint
    offer = Offer(where="gang", levels=5, discipline=Discipline.TIMESLICE, shapes=frozenset({"rigid", "moldable"}))
    offer.check(Gang())


def test_simulator_refuses_a_policy_it_cannot_serve() -> None:
    jobs = [WorkloadJob(id=1, submit=0.0, run_time=10.0, procs=1, estimate=10.0, cpu_usage=None)]
    with pytest.raises(PolicyNeedsUnmet, match="the simulator: needs 5 VM levels per core"):
        Simulator(jobs, 4, Gang())
    SIM_OFFER.check(create_policy("vcsched-mcb8"))  # capped shared VMs: offered


def test_old_policy_kind_key_loads_deprecated() -> None:
    cfg = parse_config("policy: {kind: vcsched, name: vcsched-mcb8}", "d.yaml")
    assert cfg.policy_name == "vcsched-mcb8"
    assert len(cfg.deprecations) == 1 and "policy.kind (vcsched) is deprecated and ignored" in cfg.deprecations[0]
    assert parse_config("policy: {name: easy}", "d.yaml").deprecations == ()
    with pytest.raises(ConfigError, match=r"policy\.kind"):
        parse_config("policy: {kind: gang, name: easy}", "d.yaml")
