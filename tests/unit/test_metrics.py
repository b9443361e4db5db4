"""Metrics: daemon instruments, the per-scrape collectors, promtool on the real exposition output."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vmctl.metrics import AgentMetrics, ClusterSnapshot, DaemonMetrics
from vmctl.nodedoc import NodeObserved, PowerState, VmObserved

NODES = [
    {"name": "n1", "cores": 2, "state": "ready", "fg_busy": 2, "bg_busy": 1, "utilization": 0.9,
     "last_seen": 1000.0, "last_report": 1000.0, "generation": 7, "generation_applied": 7, "refusals": []},
    {"name": "n2", "cores": 2, "state": "lost", "fg_busy": 0, "bg_busy": 0, "utilization": None,
     "last_seen": 400.0, "last_report": 400.0, "generation": 2},
]
VMS = [
    {"name": "n1-c0-fg", "node": "n1", "core": 0, "role": "fg", "weight": 10000, "cap": None, "job_id": "5",
     "utilization": 0.8, "cpu_time_s": 100.0, "power": "running"},
    {"name": "n1-c0-bg", "node": "n1", "core": 0, "role": "bg", "weight": 1, "cap": 0.5, "job_id": "6",
     "utilization": 0.2, "power": "running"},
    {"name": "n1-c1-fg", "node": "n1", "core": 1, "role": "fg", "weight": 10000, "cap": None, "job_id": "5",
     "utilization": 0.6, "power": "running"},
]


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def daemon() -> DaemonMetrics:
    m = DaemonMetrics(lambda: ClusterSnapshot(nodes=NODES, vms=VMS, time=1010.0))
    m.observe_cycle(0.004)
    m.observe_cycle(0.2)
    m.decision("start_fg")
    m.decision("migrate", "failed")
    m.migration("completed")
    m.set_queue_length(4)
    m.set_running("fg", 2)
    m.set_running("bg", 1)
    m.observe_wait(42.0)
    m.job_finished("done", 3600.0)
    m.set_leader(True, 3)
    m.api_request("jobs", 201)
    return m


def test_daemon_instruments_and_cluster_collector() -> None:
    body, ctype = daemon().exposition()
    assert ctype.startswith("text/plain")
    s = samples(body)
    assert s[("vmctl_scheduler_cycle_seconds_count", ())] == 2
    assert s[("vmctl_scheduler_cycle_seconds_bucket", (("le", "0.005"),))] == 1
    assert s[("vmctl_decisions_total", (("action", "migrate"), ("outcome", "failed")))] == 1
    assert s[("vmctl_migrations_total", (("outcome", "completed"),))] == 1
    assert s[("vmctl_queue_length", ())] == 4
    assert s[("vmctl_running_jobs", (("tier", "bg"),))] == 1
    assert s[("vmctl_job_wait_seconds_sum", ())] == 42.0
    assert s[("vmctl_job_response_seconds_bucket", (("le", "3600.0"),))] == 1
    assert s[("vmctl_leader_epoch", ())] == 3
    # per-node fg/bg utilization = sum of the tier's VM utilization / cores
    assert s[("vmctl_node_utilization_ratio", (("node", "n1"), ("tier", "fg")))] == pytest.approx(0.7)
    assert s[("vmctl_node_utilization_ratio", (("node", "n1"), ("tier", "bg")))] == pytest.approx(0.1)
    assert s[("vmctl_node_busy_cores", (("node", "n1"), ("tier", "fg")))] == 2
    assert s[("vmctl_node_state", (("node", "n2"), ("state", "lost")))] == 1
    assert s[("vmctl_node_state", (("node", "n2"), ("state", "ready")))] == 0
    assert s[("vmctl_agent_up", (("node", "n2"),))] == 0 and s[("vmctl_agent_up", (("node", "n1"),))] == 1
    assert s[("vmctl_agent_report_age_seconds", (("node", "n2"),))] == 610.0
    vm = (("node", "n1"), ("role", "bg"), ("vm", "n1-c0-bg"))
    assert s[("vmctl_vm_cap_ratio", vm)] == 0.5 and s[("vmctl_vm_weight", vm)] == 1
    assert s[("vmctl_vm_cpu_seconds_total", (("node", "n1"), ("role", "fg"), ("vm", "n1-c0-fg")))] == 100.0
    assert ("vmctl_vm_cap_ratio", (("node", "n1"), ("role", "fg"), ("vm", "n1-c0-fg"))) not in s  # uncapped
    assert s[("vmctl_collector_success", (("collector", "cluster"),))] == 1


def test_report_age_is_of_the_last_full_report_not_the_heartbeat() -> None:
    """Heartbeats (every 5 s) keep last_seen fresh; the report age counts from the last full report, so
    an agent that heartbeats but no longer reports shows its real age (VmctlAgentReportsStale), and the
    generation it applied and the migrations it refuses are exported beside the desired generation."""
    nodes = [{"name": "n3", "cores": 2, "state": "ready", "fg_busy": 0, "bg_busy": 0, "utilization": 0.0,
              "last_seen": 1005.0, "last_report": 700.0, "generation": 9, "generation_applied": 4,
              "refusals": [{"vm": "j1-r0-p0", "migration_id": "op1", "target_node": "n1", "reason": "no peer"}]},
             {"name": "n4", "cores": 2, "state": "ready", "fg_busy": 0, "bg_busy": 0, "utilization": 0.0,
              "last_seen": 1005.0, "last_report": None, "generation": 1, "generation_applied": None,
              "refusals": []}]
    s = samples(DaemonMetrics(lambda: ClusterSnapshot(nodes=nodes, vms=[], time=1010.0)).exposition()[0])
    assert s[("vmctl_agent_report_age_seconds", (("node", "n3"),))] == 310.0
    assert s[("vmctl_agent_last_seen_timestamp_seconds", (("node", "n3"),))] == 1005.0
    assert s[("vmctl_agent_applied_generation", (("node", "n3"),))] == 4
    assert s[("vmctl_node_desired_generation", (("node", "n3"),))] == 9
    assert s[("vmctl_agent_migration_refusals", (("node", "n3"),))] == 1
    assert ("vmctl_agent_report_age_seconds", (("node", "n4"),)) not in s  # no report to this daemon yet
    assert ("vmctl_agent_applied_generation", (("node", "n4"),)) not in s


def test_no_job_id_labels() -> None:
    for fam in text_string_to_metric_families(daemon().exposition()[0].decode()):
        for smp in fam.samples:
            assert not {"job", "job_id"} & set(smp.labels), smp


def test_failing_snapshot_reports_failure_not_exception() -> None:
    def boom() -> ClusterSnapshot:
        raise RuntimeError("store down")

    m = DaemonMetrics(boom)
    s = samples(m.exposition()[0])
    assert s[("vmctl_collector_success", (("collector", "cluster"),))] == 0
    assert not any(k[0].startswith("vmctl_node_") for k in s)
    m.set_cluster_source(lambda: ClusterSnapshot(nodes=NODES, vms=VMS))
    assert samples(m.exposition()[0])[("vmctl_collector_success", (("collector", "cluster"),))] == 1
    m.set_cluster_source(lambda: None)  # a standby daemon: nothing to report, not a failure
    s = samples(m.exposition()[0])
    assert s[("vmctl_collector_success", (("collector", "cluster"),))] == 1
    assert not any(k[0].startswith("vmctl_node_") for k in s)


def observed() -> NodeObserved:
    return NodeObserved(
        node="n1", generation_applied=9, cores=2, host_utilization=0.75, time=1234.0, errors=("x",),
        vms=(VmObserved(name="n1-c0-fg", power=PowerState.RUNNING, core=0, weight=10000, cpu_time_s=5.5,
                        utilization=0.9),
             VmObserved(name="n1-c0-bg", power=PowerState.PAUSED, core=0, weight=1, cap=0.25)),
    )


def test_agent_collector_and_endpoint() -> None:
    state: dict[str, Any] = {"obs": None}
    m = AgentMetrics(lambda: state["obs"])
    s = samples(m.exposition()[0])
    assert s[("vmctl_collector_success", (("collector", "agent"),))] == 0  # before the first relist
    state["obs"] = observed()
    m.observe_reconcile(0.02)
    m.action("define")
    port = m.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read()
    finally:
        m.close()
    s = samples(body)
    assert s[("vmctl_collector_success", (("collector", "agent"),))] == 1
    assert s[("vmctl_agent_vm_cpu_seconds_total", (("node", "n1"), ("vm", "n1-c0-fg")))] == 5.5
    assert s[("vmctl_agent_vm_cap_ratio", (("node", "n1"), ("vm", "n1-c0-bg")))] == 0.25
    assert s[("vmctl_agent_vm_power_state", (("node", "n1"), ("state", "paused"), ("vm", "n1-c0-bg")))] == 1
    assert s[("vmctl_agent_generation_applied", (("node", "n1"),))] == 9
    assert s[("vmctl_agent_reconcile_errors", (("node", "n1"),))] == 1
    assert s[("vmctl_agent_actions_total", (("action", "define"), ("outcome", "applied")))] == 1
    assert s[("vmctl_agent_hypervisor_up", ())] == 1


@pytest.mark.parametrize("which", ["daemon", "agent"])
def test_promtool_check_metrics(which: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; scripts/install-system-deps.sh)")
    body = daemon().exposition()[0] if which == "daemon" else AgentMetrics(observed).exposition()[0]
    r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert r.returncode == 0, (r.stdout + r.stderr).decode()
