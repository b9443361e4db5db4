"""Prometheus and Grafana artefacts, checked with the real promtool:

- ``etc/prometheus/alerts.yaml``: ``promtool check rules`` and ``promtool test rules`` on a few alerts;
- ``etc/prometheus/prometheus.yml``: ``promtool check config --syntax-only``;
- ``etc/grafana/vmctl-dashboard.json``: parses, every expression is valid PromQL (checked by promtool as
  recording rules) and references only metrics that vmctl really exports (from real exposition output).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from vmctl.metrics import AgentMetrics, ClusterSnapshot, DaemonMetrics
from vmctl.nodedoc import NodeObserved, PowerState, VmObserved

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "etc" / "prometheus" / "alerts.yaml"
PROM_CONFIG = ROOT / "etc" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "etc" / "grafana" / "vmctl-dashboard.json"
METRIC_RE = re.compile(r"\bvmctl_[a-z0-9_]+")


def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; scripts/install-system-deps.sh)")
    return exe


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def exported_names() -> set[str]:
    """Every sample name of a fully populated daemon and agent exposition."""
    d = DaemonMetrics(lambda: ClusterSnapshot(
        nodes=[{"name": "n1", "cores": 1, "state": "ready", "fg_busy": 1, "bg_busy": 1, "utilization": 0.5,
                "last_seen": 1.0, "last_report": 1.0, "generation": 1, "generation_applied": 1, "refusals": []}],
        vms=[{"name": "n1-c0-bg", "node": "n1", "core": 0, "role": "bg", "weight": 1, "cap": 0.5, "job_id": "1",
              "utilization": 0.5, "cpu_time_s": 3.0}]))
    d.observe_cycle(0.1)
    d.decision("start_fg")
    d.migration("completed")
    d.job_finished("done", 10.0)
    d.observe_wait(1.0)
    d.api_request("jobs", 200)
    a = AgentMetrics(lambda: NodeObserved(node="n1", generation_applied=1, cores=1, vms=(
        VmObserved(name="n1-c0-fg", power=PowerState.RUNNING, weight=1, cap=0.5, cpu_time_s=1.0),)))
    a.observe_reconcile(0.1)
    a.action("define")
    a.daemon_error()
    names: set[str] = set()
    for body in (d.exposition()[0], a.exposition()[0]):
        for fam in text_string_to_metric_families(body.decode()):
            names.update(s.name for s in fam.samples)
    return names


def test_alert_rules_check() -> None:
    r = run_promtool("check", "rules", str(ALERTS))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_alert_rules_reference_exported_metrics() -> None:
    names = exported_names()
    doc = yaml.safe_load(ALERTS.read_text())
    exprs = [rule["expr"] for g in doc["groups"] for rule in g["rules"]]
    assert len(exprs) >= 8
    for e in exprs:
        for m in METRIC_RE.findall(e):
            assert m in names, f"alert expression uses {m}, which vmctl does not export"


def test_alert_rules_fire(tmp_path: Path) -> None:
    shutil.copy(ALERTS, tmp_path / "alerts.yaml")
    tests = {
        "rule_files": ["alerts.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'vmctl_agent_up{node="n1", instance="d:8443", job="vmctld"}', "values": "1 1 0 0 0 0"},
                    {"series": 'vmctl_agent_up{node="n2", instance="d:8443", job="vmctld"}', "values": "1 1 1 1 1 1"},
                    {"series": 'vmctl_queue_length{instance="d:8443", job="vmctld"}', "values": "5x20"},
                    {"series": 'vmctl_running_jobs{tier="fg", instance="d:8443", job="vmctld"}', "values": "0x20"},
                    {"series": 'vmctl_running_jobs{tier="bg", instance="d:8443", job="vmctld"}', "values": "0x20"},
                ],
                "alert_rule_test": [
                    {"eval_time": "5m", "alertname": "VmctlAgentLost", "exp_alerts": [
                        {"exp_labels": {"severity": "critical", "node": "n1", "instance": "d:8443", "job": "vmctld"},
                         "exp_annotations": {
                             "summary": "Node n1 is lost",
                             "description": "vmctld has not heard from the agent of n1; its cores are not used."}}]},
                    {"eval_time": "2m", "alertname": "VmctlAgentLost", "exp_alerts": []},
                    {"eval_time": "10m", "alertname": "VmctlQueueStuck", "exp_alerts": []},
                    {"eval_time": "16m", "alertname": "VmctlQueueStuck", "exp_alerts": [
                        {"exp_labels": {"severity": "warning", "instance": "d:8443", "job": "vmctld"},
                         "exp_annotations": {
                             "summary": "Jobs are waiting but none runs",
                             "description": "5 jobs queued for 15 minutes with nothing running: "
                                            "all nodes drained or lost?"}}]},
                ],
            }
        ],
    }
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    r = run_promtool("test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def _promtool_test(tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    shutil.copy(ALERTS, tmp_path / "alerts.yaml")
    doc = {"rule_files": ["alerts.yaml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return run_promtool("test", "rules", "alerts_test.yaml", cwd=tmp_path)


D = 'instance="d:8443", job="vmctld"'
LABELS = {"instance": "d:8443", "job": "vmctld"}


def test_aborted_migrations_do_not_fire_migrations_failing(tmp_path: Path) -> None:
    """Aborted migrations (the job ended while moving, as in the README's demo) are benign; failed ones
    above 20% of the migrations that did not end with their job fire the alert."""
    benign = {"interval": "1m", "input_series": [
        {"series": f'vmctl_migrations_total{{outcome="completed", {D}}}', "values": "0+10x60"},
        {"series": f'vmctl_migrations_total{{outcome="aborted", {D}}}', "values": "0+10x60"},
        {"series": f'vmctl_migrations_total{{outcome="failed", {D}}}', "values": "0x60"},
    ], "alert_rule_test": [{"eval_time": "50m", "alertname": "VmctlMigrationsFailing", "exp_alerts": []}]}
    failing = {"interval": "1m", "input_series": [
        {"series": f'vmctl_migrations_total{{outcome="completed", {D}}}', "values": "0+10x60"},
        {"series": f'vmctl_migrations_total{{outcome="aborted", {D}}}', "values": "0+50x60"},
        {"series": f'vmctl_migrations_total{{outcome="failed", {D}}}', "values": "0+5x60"},
    ], "alert_rule_test": [{"eval_time": "50m", "alertname": "VmctlMigrationsFailing", "exp_alerts": [
        {"exp_labels": {"severity": "warning"},
         "exp_annotations": {"summary": "More than 20% of migrations fail",
                             "description": "33.33% of the migrations that did not end with their job failed in "
                                            "30 minutes."}}]}]}
    r = _promtool_test(tmp_path, [benign, failing])
    assert r.returncode == 0, r.stdout + r.stderr


def test_stale_reports_fire_while_heartbeats_keep_the_node_up(tmp_path: Path) -> None:
    """The report age is of the last full report: it grows while heartbeats keep vmctl_agent_up at 1."""
    t = {"interval": "1m", "input_series": [
        {"series": f'vmctl_agent_up{{node="n3", {D}}}', "values": "1x20"},
        {"series": f'vmctl_agent_report_age_seconds{{node="n3", {D}}}', "values": "0+60x20"},
        {"series": f'vmctl_agent_up{{node="n4", {D}}}', "values": "1x20"},
        {"series": f'vmctl_agent_report_age_seconds{{node="n4", {D}}}', "values": "10x20"},
    ], "alert_rule_test": [
        {"eval_time": "4m", "alertname": "VmctlAgentReportsStale", "exp_alerts": []},
        {"eval_time": "10m", "alertname": "VmctlAgentReportsStale", "exp_alerts": [
            {"exp_labels": {"severity": "warning", "node": "n3", **LABELS},
             "exp_annotations": {"summary": "Agent of n3 heartbeats but does not report",
                                 "description": "Last full report 10m 0s ago; see `vmctl node show n3`."}}]},
    ]}
    r = _promtool_test(tmp_path, [t])
    assert r.returncode == 0, r.stdout + r.stderr


def test_agent_refusing_its_desired_state_fires(tmp_path: Path) -> None:
    """n3 stays two generations behind without moving, n5 refuses a migration report after report: both
    fire; n4 is one generation behind but keeps applying (a busy node), which is no alert."""
    t = {"interval": "1m", "input_series": [
        {"series": f'vmctl_node_desired_generation{{node="n3", {D}}}', "values": "5x20"},
        {"series": f'vmctl_agent_applied_generation{{node="n3", {D}}}', "values": "3x20"},
        {"series": f'vmctl_node_desired_generation{{node="n4", {D}}}', "values": "1+1x20"},
        {"series": f'vmctl_agent_applied_generation{{node="n4", {D}}}', "values": "0+1x20"},
        {"series": f'vmctl_agent_migration_refusals{{node="n4", {D}}}', "values": "0x20"},
        {"series": f'vmctl_agent_migration_refusals{{node="n5", {D}}}', "values": "1x20"},
    ], "alert_rule_test": [
        {"eval_time": "3m", "alertname": "VmctlAgentRefusesDesiredState", "exp_alerts": []},
        {"eval_time": "12m", "alertname": "VmctlAgentRefusesDesiredState", "exp_alerts": [
            {"exp_labels": {"severity": "warning", "node": "n3", **LABELS},
             "exp_annotations": {"summary": "Agent of n3 does not apply its desired state",
                                 "description": "It is 2 generation(s) behind or refuses that many migrations; "
                                                "its errors are in `vmctl node show n3`."}},
            {"exp_labels": {"severity": "warning", "node": "n5", **LABELS},
             "exp_annotations": {"summary": "Agent of n5 does not apply its desired state",
                                 "description": "It is 1 generation(s) behind or refuses that many migrations; "
                                                "its errors are in `vmctl node show n5`."}}]},
    ]}
    r = _promtool_test(tmp_path, [t])
    assert r.returncode == 0, r.stdout + r.stderr


def test_prometheus_config_syntax(tmp_path: Path) -> None:
    shutil.copy(PROM_CONFIG, tmp_path / "prometheus.yml")
    shutil.copy(ALERTS, tmp_path / "alerts.yaml")
    r = run_promtool("check", "config", "--syntax-only", str(tmp_path / "prometheus.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = yaml.safe_load(PROM_CONFIG.read_text())
    assert {j["job_name"] for j in cfg["scrape_configs"]} == {"vmctld", "vmctl-agent"}


def _dashboard_exprs() -> list[tuple[str, str]]:
    dash: dict[str, Any] = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["panels"]
    out = []
    for p in dash["panels"]:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            out.append((p["title"], t["expr"]))
    return out


def test_dashboard_references_exported_metrics() -> None:
    names = exported_names()
    exprs = _dashboard_exprs()
    assert len(exprs) >= 15
    used: set[str] = set()
    for title, e in exprs:
        found = METRIC_RE.findall(e)
        assert found, f"panel {title!r}: expression uses no vmctl metric: {e}"
        for m in found:
            assert m in names, f"panel {title!r} uses {m}, which vmctl does not export"
        used.update(found)
    # the dashboard covers the headline metrics the task names
    for must in ("vmctl_queue_length", "vmctl_running_jobs", "vmctl_scheduler_cycle_seconds_bucket",
                 "vmctl_decisions_total", "vmctl_migrations_total", "vmctl_job_wait_seconds_bucket",
                 "vmctl_node_utilization_ratio", "vmctl_vm_utilization_ratio", "vmctl_agent_up"):
        assert must in used, must


def test_dashboard_exprs_are_valid_promql(tmp_path: Path) -> None:
    rules = []
    for i, (_title, e) in enumerate(_dashboard_exprs()):
        expr = e.replace("$__rate_interval", "5m").replace("$node", ".*")
        rules.append({"record": f"dashboard:expr_{i}", "expr": expr})
    (tmp_path / "dash_rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = run_promtool("check", "rules", str(tmp_path / "dash_rules.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_checker_catches_unknown_metric() -> None:
    """The reference check can fail: a made-up name is not in the exported set."""
    assert "vmctl_made_up_total" not in exported_names()
