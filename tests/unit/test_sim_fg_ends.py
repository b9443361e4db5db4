"""``ClusterView.fg_ends`` (the simulator's fg jobs sorted by expected end) matches ``view.running`` on
every pass, and EASY decides exactly the same with and without it."""

from __future__ import annotations

import dataclasses

from vmctl.model import ClusterView, Decision, Tier
from vmctl.policies.easy_family import EasyPolicy
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.workloads import generate_model


class _Checking(EasyPolicy):
    """EASY that, on every pass, checks fg_ends against running and decides twice (with and without)."""

    passes = 0
    reservations = 0

    def decide(self, view: ClusterView, now: float) -> Decision:
        want = sorted(
            (rj.expected_end, rj.job.procs, jid) for jid, rj in view.running.items() if rj.tier is Tier.FG
        )
        assert view.fg_ends is not None
        assert list(view.fg_ends) == want
        with_ends = super().decide(view, now)
        without = super().decide(dataclasses.replace(view, fg_ends=None), now)
        assert with_ends == without
        type(self).passes += 1
        if with_ends.reservation is not None:
            type(self).reservations += 1
        return with_ends


def test_fg_ends_tracks_running_and_easy_is_unchanged() -> None:
    wl = generate_model("jann97", 1500, 64, seed=3, load=0.9)
    result = Simulator(wl.jobs, wl.max_procs, _Checking()).run()
    assert result.decisions > 0
    assert _Checking.passes > 100
    assert _Checking.reservations > 10  # the reservation walk was exercised


def test_fg_ends_not_provided_in_two_tier_runs() -> None:
    wl = generate_model("jann97", 50, 16, seed=1, load=0.7)
    sim = Simulator(wl.jobs, wl.max_procs, EasyPolicy(), SimConfig(two_tier=True))
    assert sim.view.fg_ends is None
    sim.run()
