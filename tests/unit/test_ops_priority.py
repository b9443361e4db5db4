"""``vmctl vm priority set``: what a change applies to, and a tier change the rules refuse is a conflict
naming its cores as node:core (exit 4), not an internal invariant violation (exit 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_daemon_core import Cluster
from vmctl.errors import Conflict, exit_code_for
from vmctl.model import ClusterView, Decision, StartBg, StartFg
from vmctl.policies.base import SchedulingPolicy


class FgAndBgOnN2(SchedulingPolicy):
    """The first job fg and the second bg, both on the first two cores of n2 (global cores 4, 5)."""

    name = "fg-and-bg-on-n2"

    def decide(self, view: ClusterView, now: float) -> Decision:
        acts: list[Any] = []
        for j in view.queue:
            if not view.fg_job[4] and not any(isinstance(a, StartFg) for a in acts):
                acts.append(StartFg(j.id, (4, 5)))
            elif not view.bg_job[4]:
                acts.append(StartBg(j.id, (4, 5)))
        return Decision(actions=tuple(acts))


def test_promote_on_busy_fg_slots_names_node_and_core(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 4, "n2": 4}, policy=FgAndBgOnN2())
    fg = c.submit(2, 100, 80)
    bg = c.submit(2, 100, 80)
    c.run_until(lambda: c.state(fg) == "running" and c.state(bg) == "running")
    rec = c.daemon.job(bg)
    assert rec.tier == "bg"
    with pytest.raises(Conflict) as err:
        c.daemon.set_vm_priority(rec.vm_name(1), "fg", None, None, False, None)
    msg = err.value.message
    assert "core n2:0" in msg and "core 4" not in msg, msg
    assert f"promote of job {bg}" in msg
    assert exit_code_for(err.value) == 4
    assert c.daemon.job(bg).tier == "bg"  # nothing half-applied
    c.close()


def test_operator_promote_is_in_the_job_history(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 4, "n2": 4}, policy=FgAndBgOnN2())
    fg = c.submit(2, 100, 3)
    bg = c.submit(2, 100, 80)
    c.run_until(lambda: c.state(fg) == "done" and c.state(bg) == "running")
    c.daemon.set_vm_priority(c.daemon.job(bg).vm_name(0), "fg", None, None, False, None)
    hist = c.daemon.job(bg).history
    assert c.daemon.job(bg).tier == "fg"
    assert hist[-1]["event"] == "tier" and hist[-1]["detail"] == "bg -> fg by the operator", hist
    assert [h["event"] for h in c.daemon.job(fg).history] == ["submitted", "started", "running", "done"]
    c.close()
