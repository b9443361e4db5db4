"""Paper 001's workers in vmctld (sec. II-B-3): one per VM slot, available / occupied / busy / down, as
``GET /v1/workers`` and ``vmctl worker list`` show them (``vmctl.api.documents.workers_json``)."""

from __future__ import annotations

from pathlib import Path

from vmctl.api.documents import workers_json
from vmctl.cli.worker import worker_table
from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.core import Daemon
from vmctl.model import WORKER_STATES
from vmctl.nodedoc import NodeObserved, PowerState, VmObserved
from vmctl.policies.easy_family import FcfsPolicy
from vmctl.store import open_store


def _daemon(tmp: Path) -> Daemon:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp), tick_s=5.0, holder="workers-test",
                       checkpoint_dir=str(tmp / "ckpt"))
    d = Daemon(cfg, open_store(cfg.store_url), clock=VirtualClock(1000.0), policy=FcfsPolicy())
    assert d.start()
    return d


def states(d: Daemon) -> dict[str, tuple[str, str | None]]:
    return {w["id"]: (w["state"], w["job_id"]) for w in workers_json(d)}


def test_worker_states_follow_the_job_and_the_node(tmp_path: Path) -> None:
    d = _daemon(tmp_path)
    d.register_node("n0", 2, "h0", "mock", speed=2.0)
    assert states(d) == {f"n0/{c}.{lv}": ("available", None) for c in range(2) for lv in range(2)}
    (job,) = d.submit([{"procs": 1, "estimate": 50.0}])
    d.decide(d.clock.now())
    (vm,) = d.state.desired["n0"]
    mine, free = f"n0/{vm.core}.0", f"n0/{1 - vm.core}.1"
    # assigned to the job, its process not running yet: occupied
    assert states(d)[mine] == ("occupied", job.id)
    running = VmObserved(vm.name, PowerState.RUNNING, core=vm.core, process_job=job.id, process_index=0)
    d.report(NodeObserved("n0", d.state.generation["n0"], 2, (running,)))
    got = states(d)
    assert got[mine] == ("busy", job.id)
    assert [s for k, (s, _j) in got.items() if k != mine] == ["available"] * 3
    assert workers_json(d, "n0")[0]["speed"] == 1.0  # the node's speed shared by its 2 levels
    d.set_node_state("n0", True, "maintenance")  # draining: the free slots take no work
    got = states(d)
    assert got[mine] == ("busy", job.id) and got[free] == ("down", None)
    assert {s for s, _j in got.values()} <= set(WORKER_STATES)
    d.close()


def test_the_worker_table() -> None:
    text = worker_table([{"id": "n0/0.1", "node": "n0", "core": 0, "level": 1, "speed": 0.5, "state": "busy",
                          "job_id": "j7"}]).to_text()
    assert "WORKER" in text and "n0/0.1" in text and "busy" in text and "j7" in text and "0.5x" in text


def test_worker_states_in_the_metrics() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from vmctl.metrics import ClusterSnapshot, DaemonMetrics

    workers = [{"node": "n0", "state": "busy"}, {"node": "n0", "state": "busy"}, {"node": "n0", "state": "down"},
               {"node": "n1", "state": "available"}]
    text = DaemonMetrics(lambda: ClusterSnapshot(workers=workers)).exposition()[0].decode()
    got = {(s.labels["node"], s.labels["state"]): s.value for fam in text_string_to_metric_families(text)
           if fam.name == "vmctl_workers" for s in fam.samples}
    assert got == {("n0", "available"): 0, ("n0", "occupied"): 0, ("n0", "busy"): 2, ("n0", "down"): 1,
                   ("n1", "available"): 1, ("n1", "occupied"): 0, ("n1", "busy"): 0, ("n1", "down"): 0}
