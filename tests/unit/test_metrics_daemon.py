"""``GET /metrics`` of a real vmctld (subprocess on loopback, SQLite in tmp): the bridge from the
daemon's state to the instruments, an agent registering over mTLS, and promtool on the real output."""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.livedaemon import live_daemon
from vmctl import errors
from vmctl.apiclient import ApiClient
from vmctl.files import write_cert_files
from vmctl.localcluster import DaemonProcess


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    yield from live_daemon(tmp_path_factory.mktemp("vmctld"), policy="easy", tick_s=0.2)


def values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def register_node(d: DaemonProcess, client: ApiClient, node: str, cores: int, tmp: Path) -> None:
    crt, key, ca = write_cert_files(tmp, node, client.issue_cert(node))
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(crt), str(key))
    conn = http.client.HTTPSConnection("127.0.0.1", d.port, context=ctx, timeout=10)
    try:
        body = json.dumps({"cores": cores, "hostname": node, "backend": "mock"})
        conn.request("POST", f"/v1/agent/nodes/{node}/register", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        resp.read()
    finally:
        conn.close()


def test_metrics_follow_the_daemon(daemon: DaemonProcess, tmp_path: Path) -> None:
    client = daemon.client()
    m = values(client.metrics_text())
    assert m[("vmctl_leader", ())] == 1
    assert m[("vmctl_collector_success", (("collector", "cluster"),))] == 1
    client.submit_jobs([{"procs": 2, "estimate": 30}, {"procs": 1, "estimate": 30}, {"procs": 64, "estimate": 30}])
    m = values(client.metrics_text())
    assert m[("vmctl_queue_length", ())] == 3
    register_node(daemon, client, "n1", 4, tmp_path)
    deadline = time.monotonic() + 60
    while True:
        m = values(client.metrics_text())
        if m.get(("vmctl_running_jobs", (("tier", "fg"),))) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert m[("vmctl_running_jobs", (("tier", "fg"),))] == 2  # easy: both small jobs start in fg
    assert m[("vmctl_queue_length", ())] == 1  # the 64-proc job cannot run on 4 cores
    assert m[("vmctl_job_wait_seconds_count", ())] == 2
    assert m[("vmctl_scheduler_cycles_total", ())] >= 1
    assert m[("vmctl_node_cores", (("node", "n1"),))] == 4
    assert m[("vmctl_node_busy_cores", (("node", "n1"), ("tier", "fg")))] == 3
    assert m[("vmctl_agent_up", (("node", "n1"),))] == 1
    assert m[("vmctl_node_state", (("node", "n1"), ("state", "ready")))] == 1
    vm_weights = {k[1]: v for k, v in m.items() if k[0] == "vmctl_vm_weight"}
    assert vm_weights, "the VMs of the node are exported"
    for labels in vm_weights:
        assert {k for k, _ in labels} == {"vm", "node", "role"}  # no job id label


def test_promtool_on_live_daemon_output(daemon: DaemonProcess) -> None:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not installed (Debian package 'prometheus')")
    text = daemon.client().metrics_text()
    r = subprocess.run([exe, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_metrics_need_a_token(daemon: DaemonProcess) -> None:
    anon = ApiClient(daemon.url, token="", ca=str(daemon.ca_path))
    with pytest.raises(errors.Unauthenticated):
        anon.metrics_text()
