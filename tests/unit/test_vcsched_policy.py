"""The ``vcsched-*`` policies on ClusterViews, and the invariant checks of PlaceShared. The paper's
examples run on one-core nodes (its hosts are one unit of CPU); issue 22's multi-core nodes (a node's
capacity is its cores, needs and caps are fractions of one core) at the end."""

from __future__ import annotations

import dataclasses

import pytest

from tests.viewbuilder import view
from vmctl.errors import InvariantViolation, PolicyParameterError
from vmctl.model import ClusterView, Decision, Job, PlaceShared, RunningJob, SetCap, Tier
from vmctl.policies.invariants import check_decision
from vmctl.policies.registry import available_policies, create_policy


def vjob(jid: str, procs: int = 1, cpu: float = 0.6, mem: float = 0.0, submit: float = 0.0) -> Job:
    return Job(id=jid, submit_time=submit, procs=procs, estimate=100.0, cpu_need=cpu, mem=mem)


def two_nodes(queue: list[Job], running: list[tuple[Job, tuple[int, ...]]] = (),  # type: ignore[assignment]
              cores: int = 1) -> ClusterView:
    """Nodes a and b of ``cores`` cores each; ``running`` jobs stand on the first core of their node."""
    v = view(2 * cores, queue=queue, running=[(j, Tier.FG, tuple(c * cores for c in cs), 0.0) for j, cs in running])
    return dataclasses.replace(v, node_of_core=["a"] * cores + ["b"] * cores,
                               local_core=list(range(cores)) * 2, node_names=["a", "b"])


def shared_view(nodes: dict[str, int], running: list[tuple[Job, tuple[str, ...], float]],
                queue: list[Job] = ()) -> ClusterView:  # type: ignore[assignment]
    """Nodes of the given core counts, with running jobs of shared VMs ``(job, nodes, cap)`` (as vmctld
    shows them: each VM stands on its node's first core, several may share it)."""
    names = list(nodes)
    node_of_core = [n for n in names for _ in range(nodes[n])]
    first = {n: node_of_core.index(n) for n in names}
    v = view(len(node_of_core), queue=queue)
    running_jobs = {j.id: RunningJob(job=j, tier=Tier.FG, cores=tuple(first[n] for n in where), start_time=0.0,
                                     tier_since=0.0, progress=0.0, expected_end=j.estimate, cap=cap,
                                     shared_nodes=where)
                    for j, where, cap in running}
    return dataclasses.replace(v, node_of_core=node_of_core, local_core=[0] * len(node_of_core), node_names=names,
                               running=running_jobs)


def test_every_algorithm_is_registered() -> None:
    names = set(available_policies())
    for a in ("milp", "rrnd", "rrnz", "gr", "sg", "gb", "sgb", *(f"mcb{k}" for k in range(1, 9))):
        assert f"vcsched-{a}" in names
    assert {"vcsched-dynamic", "vcsched-dyn-milp"} <= names


@pytest.mark.parametrize("name", ["vcsched-mcb8", "vcsched-milp", "vcsched-sg", "vcsched-gb", "vcsched-dynamic"])
def test_sec_2_3_example_as_a_policy(name: str) -> None:
    v = two_nodes([vjob("0"), vjob("1"), vjob("2")])
    d = create_policy(name).decide(v, 0.0)
    check_decision(v, d, 0.0)
    assert all(isinstance(a, PlaceShared) for a in d.actions)
    caps = sorted(a.cap for a in d.actions if isinstance(a, PlaceShared))
    assert caps == pytest.approx([0.5, 0.5, 0.6])
    per_node: dict[str, float] = {}
    for a in d.actions:
        assert isinstance(a, PlaceShared)
        per_node[a.nodes[0]] = per_node.get(a.nodes[0], 0.0) + a.cap
    assert sorted(per_node.values()) == pytest.approx([0.6, 1.0])


def test_parallel_job_spans_nodes_with_one_cap() -> None:
    v = two_nodes([vjob("p", procs=2, cpu=0.8, mem=0.6)])
    d = create_policy("vcsched-mcb8").decide(v, 0.0)
    check_decision(v, d, 0.0)
    (act,) = d.actions
    assert isinstance(act, PlaceShared) and sorted(act.nodes) == ["a", "b"] and act.cap == pytest.approx(0.8)


def test_admission_keeps_running_jobs_and_delays_the_queue_tail() -> None:
    v = two_nodes([vjob("q1", mem=0.5), vjob("q2", mem=0.5), vjob("q3", mem=0.5)])
    d = create_policy("vcsched-mcb8").decide(v, 0.0)
    check_decision(v, d, 0.0)
    placed = [a.job_id for a in d.actions]
    assert placed == ["q1", "q2", "q3"] or len(placed) == 3
    # memory for 4 halves only: the fifth job waits, with a reason
    v = two_nodes([vjob(f"q{i}", mem=0.5) for i in range(5)])
    d = create_policy("vcsched-mcb8").decide(v, 0.0)
    check_decision(v, d, 0.0)
    assert [a.job_id for a in d.actions] == ["q0", "q1", "q2", "q3"]
    assert "vcsched" in d.default_reason


def test_min_yield_threshold_limits_admission() -> None:
    v = two_nodes([vjob(str(i), cpu=0.6) for i in range(4)])
    d = create_policy("vcsched-mcb8", min_yield=0.9).decide(v, 0.0)
    check_decision(v, d, 0.0)
    assert len(d.actions) == 2  # a third 0.6 task would share a host: yield 0.833 < 0.9
    with pytest.raises(PolicyParameterError):
        create_policy("vcsched-mcb8", min_yield=1.5)


def test_running_job_on_same_node_gets_setcap() -> None:
    running = vjob("r", cpu=0.6)
    v = two_nodes([vjob("q", cpu=0.6)], running=[(running, (0,))])
    d = create_policy("vcsched-dynamic", migration_budget=0.0).decide(v, 0.0)
    check_decision(v, d, 0.0)
    kinds = {a.job_id: a for a in d.actions}
    assert isinstance(kinds["r"], SetCap) and kinds["r"].cap == pytest.approx(0.6)
    assert isinstance(kinds["q"], PlaceShared) and kinds["q"].nodes == ("b",)


def test_dynamic_budget_zero_never_moves_running_jobs() -> None:
    # three running 0.5 jobs crammed on one-core node a; budget 0 keeps them there
    jobs = [vjob(f"r{i}", cpu=0.5, mem=0.3) for i in range(3)]
    v = shared_view({"a": 1, "b": 1}, [(j, ("a",), 0.5 / 1.5) for j in jobs])
    stay = create_policy("vcsched-dynamic", migration_budget=0.0).decide(v, 0.0)
    assert all(isinstance(a, SetCap) and a.cap == pytest.approx(0.5 / 1.5) for a in stay.actions)
    move = create_policy("vcsched-dynamic", migration_budget=0.3).decide(v, 0.0)
    check_decision(v, move, 0.0)
    moved = [a for a in move.actions if isinstance(a, PlaceShared)]
    assert len(moved) == 1 and moved[0].nodes == ("b",)


def test_policy_is_deterministic_per_seed() -> None:
    v = two_nodes([vjob(str(i), cpu=0.3 + 0.05 * i, mem=0.1) for i in range(6)])
    a = create_policy("vcsched-rrnz", seed=3).decide(v, 0.0)
    b = create_policy("vcsched-rrnz", seed=3).decide(v, 0.0)
    assert a == b


def test_unsubmitted_jobs_are_not_placed() -> None:
    v = two_nodes([vjob("now"), vjob("later", submit=10.0)])
    d = create_policy("vcsched-mcb8").decide(v, 0.0)
    check_decision(v, d, 0.0)
    assert [a.job_id for a in d.actions] == ["now"]


# ----------------------------------------------------------------------------- invariants


def _check(v: ClusterView, *acts: PlaceShared | SetCap) -> None:
    check_decision(v, Decision(actions=acts), 0.0)


def test_invariants_reject_bad_place_shared() -> None:
    v = two_nodes([vjob("x", procs=2, cpu=0.6, mem=0.6), vjob("y", cpu=0.6, mem=0.3)])
    _check(v, PlaceShared("x", ("a", "b"), 0.5), PlaceShared("y", ("b",), 0.4))
    cases = {
        "cores-count": (PlaceShared("x", ("a",), 0.5),),
        "unknown-node": (PlaceShared("x", ("a", "c"), 0.5),),
        "cap-range": (PlaceShared("x", ("a", "b"), 0.7),),  # above the job's need
        "node-cpu": (PlaceShared("x", ("a", "b"), 0.6), PlaceShared("y", ("a",), 0.6)),
        "node-memory": (PlaceShared("x", ("a", "a"), 0.3),),
        "place-shared-unknown": (PlaceShared("zz", ("a",), 0.5),),
    }
    for rule, acts in cases.items():
        with pytest.raises(InvariantViolation) as exc:
            _check(v, *acts)
        assert exc.value.fields["rule"] == rule, rule
    with pytest.raises(InvariantViolation) as exc:
        _check(v, PlaceShared("y", ("a",), 0.5), PlaceShared("y", ("b",), 0.5))
    assert exc.value.fields["rule"] == "place-shared-unknown"


def test_invariants_start_before_submit() -> None:
    v = two_nodes([vjob("late", submit=5.0)])
    with pytest.raises(InvariantViolation) as exc:
        _check(v, PlaceShared("late", ("a",), 0.5))
    assert exc.value.fields["rule"] == "start-before-submit"


# ----------------------------------------------------------------------------- multi-core nodes (issue 22)


def _caps_by_node(d: Decision) -> dict[str, float]:
    per_node: dict[str, float] = {}
    for a in d.actions:
        assert isinstance(a, PlaceShared | SetCap)
        if isinstance(a, PlaceShared):
            for n in a.nodes:
                per_node[n] = per_node.get(n, 0.0) + a.cap
    return per_node


@pytest.mark.parametrize("name", ["vcsched-mcb8", "vcsched-milp", "vcsched-sg", "vcsched-gb", "vcsched-dynamic"])
def test_four_vms_of_need_0_4_on_4_core_nodes_run_at_their_need(name: str) -> None:
    """The issue's case: on 4-core nodes a job of 4 VMs needing 0.4 of a core each gets caps of 0.4
    (yield 1), not 0.25 (one core shared by four)."""
    v = two_nodes([vjob("vc", procs=4, cpu=0.4)], cores=4)
    d = create_policy(name).decide(v, 0.0)
    check_decision(v, d, 0.0)
    (act,) = d.actions
    assert isinstance(act, PlaceShared) and act.cap == pytest.approx(0.4) and len(act.nodes) == 4
    assert all(total <= 4.0 + 1e-9 for total in _caps_by_node(d).values())


def test_the_sec_2_3_example_fits_on_two_core_nodes() -> None:
    """Three 0.6 VMs: on one-core nodes two share (0.5 each, yield 0.833); on 2-core nodes all run at
    their need (a node holds 2 cores of caps)."""
    v = two_nodes([vjob("0"), vjob("1"), vjob("2")], cores=2)
    d = create_policy("vcsched-mcb8").decide(v, 0.0)
    check_decision(v, d, 0.0)
    assert sorted(a.cap for a in d.actions if isinstance(a, PlaceShared)) == pytest.approx([0.6] * 3)


def test_caps_never_exceed_one_core_and_node_caps_never_exceed_the_cores() -> None:
    """9 VMs needing a whole core on 2 nodes of 4 cores: 5 on one node, 4 on the other, so every cap is
    4/5 of a core (one cap per job; the fuller node sets it) and each node's caps sum to at most 4; 7 of
    them fit at 1.0 each (a cap is never above one core, even where a node has a core to spare)."""
    v = two_nodes([vjob("big", procs=9, cpu=1.0)], cores=4)
    d = create_policy("vcsched-mcb8").decide(v, 0.0)
    check_decision(v, d, 0.0)
    (act,) = d.actions
    assert isinstance(act, PlaceShared) and act.cap == pytest.approx(0.8)
    assert max(_caps_by_node(d).values()) <= 4.0 + 1e-9
    v = two_nodes([vjob("seven", procs=7, cpu=1.0)], cores=4)
    d = create_policy("vcsched-mcb8").decide(v, 0.0)
    check_decision(v, d, 0.0)
    (act,) = d.actions
    assert isinstance(act, PlaceShared) and act.cap == pytest.approx(1.0)


def test_nodes_of_different_core_counts_count_as_the_smallest() -> None:
    """The paper's hosts are identical: nodes of 2 and 4 cores are both hosts of 2 cores (never
    overcommitted; the 4-core node's other 2 cores stay idle): 6 VMs of need 1 get 4/6 each."""
    v = shared_view({"a": 2, "b": 4}, [], queue=[vjob("vc", procs=6, cpu=1.0)])
    d = create_policy("vcsched-mcb8").decide(v, 0.0)
    check_decision(v, d, 0.0)
    (act,) = d.actions
    assert isinstance(act, PlaceShared) and act.cap == pytest.approx(4 / 6)
    per_node = _caps_by_node(d)
    assert per_node["a"] <= 2.0 + 1e-9 and per_node["b"] <= 4.0 + 1e-9


def test_a_running_cluster_on_a_4_core_node_is_recapped_up_to_its_need() -> None:
    """Three running VMs of need 0.9 on one 4-core node, a fourth arrives: 3.6 of 4 cores, everyone at
    its need (budget 0: nothing moves)."""
    running = [(vjob(f"r{i}", cpu=0.9, mem=0.1), ("a",), 0.9) for i in range(3)]
    v = shared_view({"a": 4}, running, queue=[vjob("q", cpu=0.9, mem=0.1)])
    d = create_policy("vcsched-dynamic", migration_budget=0.0).decide(v, 0.0)
    check_decision(v, d, 0.0)
    caps = {a.job_id: a.cap for a in d.actions}
    assert caps == pytest.approx({"r0": 0.9, "r1": 0.9, "r2": 0.9, "q": 0.9})
    # a fifth would need 4.5 of 4 cores: everyone at 4 / 4.5 of its need
    v = shared_view({"a": 4}, running, queue=[vjob("q", cpu=0.9, mem=0.1), vjob("q2", cpu=0.9, mem=0.1)])
    d = create_policy("vcsched-dynamic", migration_budget=0.0).decide(v, 0.0)
    check_decision(v, d, 0.0)
    assert [a.cap for a in d.actions] == pytest.approx([0.8] * 5)


def test_random_clusters_respect_one_core_per_vm_and_the_node_cores() -> None:
    import random

    rng = random.Random(7)
    for _ in range(40):
        cores = {f"n{i}": rng.choice((1, 2, 4, 8)) for i in range(rng.randint(1, 4))}
        jobs = [vjob(f"j{k}", procs=rng.randint(1, 6), cpu=rng.uniform(0.05, 1.0), mem=rng.uniform(0, 0.2))
                for k in range(rng.randint(1, 8))]
        v = shared_view(cores, [], queue=jobs)
        d = create_policy(rng.choice(["vcsched-mcb8", "vcsched-sg", "vcsched-dynamic"])).decide(v, 0.0)
        check_decision(v, d, 0.0)
        need = {j.id: j.cpu_need for j in jobs}
        for a in d.actions:
            assert isinstance(a, PlaceShared) and 0 < a.cap <= min(1.0, need[a.job_id]) + 1e-9
        for node, total in _caps_by_node(d).items():
            assert total <= cores[node] + 1e-6, (node, total, cores)


def test_invariants_count_a_nodes_cores() -> None:
    """The checker holds a node's caps to its cores (4 here) and each cap to one core."""
    v = two_nodes([vjob("x", procs=4, cpu=1.0), vjob("y", procs=2, cpu=1.0)], cores=4)
    _check(v, PlaceShared("x", ("a", "a", "a", "a"), 1.0), PlaceShared("y", ("b", "b"), 1.0))
    with pytest.raises(InvariantViolation) as exc:
        _check(v, PlaceShared("x", ("a", "a", "a", "a"), 1.0), PlaceShared("y", ("a", "b"), 1.0))
    assert exc.value.fields["rule"] == "node-cpu" and "> 4 (its cores)" in str(exc.value)
    big = two_nodes([vjob("z", cpu=1.0)], cores=4)
    with pytest.raises(InvariantViolation) as exc:
        _check(big, PlaceShared("z", ("a",), 1.5))
    assert exc.value.fields["rule"] == "cap-range"
