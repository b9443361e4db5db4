"""issue 22, "Mock agents honour node speed for every shape": a task bag's tasks on mock worker hosts of
``host.speed`` 2 and 1 (vmctld running ``dispatch-priority``, the agents reconciling over HTTPS). Each
task's span is read from the mock host that ran it (its journal: ``start_process`` -> ``process_exited``,
in the host's model time, so no report delay or wall-time window enters): ``work / speed``, half as long
on the speed-2 host as on the speed-1 host. vmctld's record of each task names the same host. (Moldable
jobs at node speed: tests/integration/test_moldable_daemon.py; the backend's rule, alone, shared and
migrated: tests/unit/test_agent_mock.py.)"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import InProcessDaemon, cli_daemon
from tests.support.taskbags import WorkerHosts
from vmctl.client import Client, Job, Task


@pytest.fixture()
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessDaemon]:
    with cli_daemon(tmp_path, monkeypatch, "node-speed", policy_name="dispatch-priority",
                    policy_params={"conserving": True}) as d:
        yield d


def test_a_bag_task_on_a_speed_2_host_takes_half_the_time(live: InProcessDaemon, tmp_path: Path) -> None:
    d = live
    work = 1.2
    # 2 single-core hosts of 2 workers each, speeds 2 and 1; sleeping tasks (cpu_usage 0.01: two busy
    # workers of one core both run at full speed), so a task's span is its work over its host's speed
    with WorkerHosts(d, tmp_path, hosts=2, speeds=(2.0, 1.0)) as hosts:
        status, body = d.request("GET", "/v1/nodes")
        assert status == 200 and {n["name"]: n["speed"] for n in body["nodes"]} == {"w00": 2.0, "w01": 1.0}
        job = Job("speeds", independent=True, max_workers=4)
        for _ in range(8):
            job.add_task(Task(work_seconds=work, cpu_usage=0.01))
        client = Client(job, url=d.url, token=d.admin_token, ca=d.ca_file, poll_interval=0.1,
                        max_poll_interval=0.3).start()
        [res] = client.wait_all(timeout=90)
        assert res.ok and len(res.tasks) == 8, res
        spans: dict[str, list[float]] = {}
        for _source, _reporter, backend in hosts.parts:
            started: dict[str, float] = {}
            for e in backend.operations("start_process", "process_exited"):
                m = re.match(r"(\S+\[\d+\])", e.detail)
                assert m is not None, e
                if e.operation == "start_process":
                    started[m.group(1)] = e.time
                else:
                    spans.setdefault(backend.hostname, []).append(e.time - started.pop(m.group(1)))
            assert not started, started  # every task that started there ended there
        assert set(spans) == {"w00", "w01"}, spans  # the bag used both hosts
        assert sum(len(s) for s in spans.values()) == 8
        assert spans["w00"] == pytest.approx([work / 2.0] * len(spans["w00"]), rel=1e-6)
        assert spans["w01"] == pytest.approx([work / 1.0] * len(spans["w01"]), rel=1e-6)
        # vmctld's record of each task names the host whose journal holds it
        by_host = {h: len(s) for h, s in spans.items()}
        recorded: dict[str, int] = {}
        for t in res.tasks:
            assert t.worker is not None and t.exit_status == 0, t
            host = str(t.worker).split("/")[0]
            recorded[host] = recorded.get(host, 0) + 1
        assert recorded == by_host, (recorded, by_host)
