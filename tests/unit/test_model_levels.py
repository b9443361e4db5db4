"""Levels in the model: a core carries L VM levels under one discipline; fg/bg name levels 0 and 1."""

from __future__ import annotations

import pytest

from vmctl.errors import ValidationError
from vmctl.model import ClusterView, Discipline, Job, RunningJob, Tier


def _view(levels: int, discipline: Discipline) -> ClusterView:
    slots = [[None, None] for _ in range(levels)]
    slots[levels - 1][1] = "a"
    idle = [{0, 1} for _ in range(levels)]
    idle[levels - 1] = {0}
    return ClusterView.leveled(2, [], {}, slots, idle, discipline, [0.0, 0.0], [True, True])


def test_priority_view_names_levels_fg_and_bg() -> None:
    v = _view(2, Discipline.PRIORITY)
    assert v.levels == 2 and v.slot_job[0] is v.fg_job and v.slot_job[1] is v.bg_job
    assert v.bg_job[1] == "a" and v.idle[1] == {0} and v.idle_bg == {0}


def test_timeslice_view_has_one_occupancy_per_row() -> None:
    v = _view(5, Discipline.TIMESLICE)
    assert v.levels == 5 and len(v.slot_job) == 5 and len(v.idle) == 5
    assert v.slot_job[4][1] == "a" and v.idle[4] == {0} and v.bg_job == [None, None]


def test_one_level_view_has_no_bg() -> None:
    v = _view(1, Discipline.SHARED)
    assert v.levels == 1 and v.slot_job == (v.fg_job,) and v.idle_bg == frozenset()


def test_view_refuses_inconsistent_levels() -> None:
    with pytest.raises(ValidationError, match="priority discipline has 2 levels"):
        _view(3, Discipline.PRIORITY)
    with pytest.raises(ValidationError, match="upper levels"):
        ClusterView(total_cores=1, queue=[], running={}, fg_job=[None], bg_job=[None], idle_fg={0},
                    idle_bg={0}, fg_util=[0.0], usable=[True], levels=3, discipline=Discipline.TIMESLICE)


def test_running_job_level_follows_tier_and_checks_it() -> None:
    job = Job("j", 0.0, 2, 10.0)
    assert RunningJob(job, Tier.FG, (0, 1), 0.0, 0.0).level == 0
    bg = RunningJob(job, Tier.BG, (0, 1), 0.0, 0.0)
    assert bg.level == 1 and bg.width == 2
    assert RunningJob(job, Tier.BG, (0, 1), 0.0, 0.0, level=3).level == 3
    with pytest.raises(ValidationError, match="level 0"):
        RunningJob(job, Tier.BG, (0, 1), 0.0, 0.0, level=0)
