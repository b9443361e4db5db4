"""Task bags on real libvirt (paper 001's testbed, issue 12): a vmctl-agent on the system libvirtd with a
``shared`` layout of 2 workers on 1 core boots the SSH guest of ``vmctl/guestimage.py`` (Debian kernel, busybox,
dropbear; TCG) for each worker vmctld gives a bag, and runs the bag's tasks in it over SSH
(``ParamikoRunner`` through a forwarded loopback port). The proof that they ran in the guests: each task
prints its guest's hostname (the worker VM's name, from the kernel command line) and uptime, and that
output, read back over SSH by the agent's runner, names the worker vmctld's task result names; exit
statuses come back (one task exits 3); each worker is handed its next task when one ends; a task's span
covers its ``sleep``.

Skipped with the reason when libvirtd/QEMU cannot run here or the guest cannot be built (it needs
``apt-get download`` of Debian's packages; the build is cached in ``/var/cache/vmctl/guest``)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import PREFIX
from tests.support.daemon import InProcessDaemon, cli_daemon, wait_for
from vmctl.client import Client, Job, Task
from vmctl.localcluster import free_port_range, ssh_guest_config

pytestmark = pytest.mark.libvirt

GUEST_DIR = Path("/var/cache/vmctl/guest")
SLEEP_S = 2.0
UPTIME_STEP_S = 0.0101  # the resolution of the guest's /proc/uptime, and a little rounding


@pytest.fixture(scope="module")
def guest(system_host: Any) -> Path:
    from vmctl.errors import VmctlError
    from vmctl.guestimage import build

    try:
        build(GUEST_DIR, log=None)
    except VmctlError as exc:
        pytest.skip(f"the SSH guest cannot be built here: {exc}")
    return GUEST_DIR


@pytest.fixture()
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessDaemon]:
    with cli_daemon(tmp_path, monkeypatch, "libvirt-taskbags", policy_name="dispatch-priority",
                    policy_params={"conserving": True}) as d:
        yield d


def remove_node_vms(backend: Any, node: str) -> None:
    """Remove the VMs the agent of ``node`` made (vmctld names job VMs ``j<id>-r<run>-p<k>``: no test
    prefix; the agent's metadata says whose they are)."""
    import contextlib

    from vmctl.agents.layout import META_NODE

    for v in backend.list_vms():
        if v.metadata.get(META_NODE) == node:
            with contextlib.suppress(Exception):
                backend.stop(v.name)
            with contextlib.suppress(Exception):
                backend.undefine(v.name)


class Outputs:
    """Wraps the agent's runner: the output and exit status of every task process it saw end."""

    def __init__(self, runner: Any) -> None:
        self.seen: dict[tuple[str, int], tuple[str, int, str]] = {}  # (job, task) -> (VM, exit, output)
        real = runner.status

        def status(vm: str) -> Any:
            st = real(vm)
            if st is not None and st.exit_code is not None:
                self.seen[(st.job_id, st.index)] = (vm, st.exit_code, st.output_tail)
            return st

        runner.status = status


def test_a_libvirt_agent_runs_task_bags_in_its_guests_over_ssh(live: InProcessDaemon, guest: Path,
                                                                tmp_path: Path) -> None:
    from vmctl.agents.config import parse_agent_config
    from vmctl.agents.main import build_agent, serve

    d = live
    node = f"{PREFIX}lv"
    cert, key = d.agent_cert(node, tmp_path / "certs")
    base = free_port_range(2)
    extra = ssh_guest_config(guest, tmp_path / "known_hosts", base, 2)
    raw = {"node": node, "backend": {"kind": "libvirt", "uri": "qemu:///system", **extra["backend"]},
           "layout": {"cores": [0], "levels": 2, "discipline": "shared", **extra["layout"]},
           "ssh": extra["ssh"],
           "daemon": {"url": d.url, "cert_file": cert, "key_file": key, "ca_file": d.ca_file, "wait_seconds": 1.0},
           "reconcile": {"resync_seconds": 0.5, "backoff_initial_seconds": 0.2, "backoff_max_seconds": 0.5}}
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    agent = build_agent(parse_agent_config(raw, str(tmp_path / "agent.yaml")))
    outputs = Outputs(agent.reconciler.runner)
    stop = threading.Event()
    th = threading.Thread(target=serve, args=(agent, stop), daemon=True)
    th.start()
    try:
        wait_for(lambda: any(n.get("state") == "ready" for n in d.request("GET", "/v1/nodes")[1]["nodes"]),
                 "the libvirt agent to register", 30)
        # the guest's uptime when the task starts and ends: boot-to-first-task and hand-off times on its clock
        cmd = (f"s=$(cut -d' ' -f1 /proc/uptime); sleep {SLEEP_S:g}; echo \"task $VMCTL_JOB_ID/$VMCTL_PROCESS_INDEX "
               "on $(hostname) up $s $(cut -d' ' -f1 /proc/uptime)\"")
        bags = []
        for name in ("a", "b"):
            job = Job(name, independent=True, max_workers=2)
            for i in range(3):
                job.add_task(Task(command=cmd + ("; exit 3" if (name, i) == ("b", 1) else ""), work_seconds=SLEEP_S))
            bags.append(job)
        t0 = time.time()
        client = Client(bags, url=d.url, token=d.admin_token, ca=d.ca_file, poll_interval=0.2, max_poll_interval=0.5)
        try:
            results = client.start().wait_all(timeout=90)
        finally:
            client.close()
        took = time.time() - t0
    finally:
        stop.set()
        agent.reconciler.wake()
        th.join(30)
        agent.reconciler.reporter.close()  # serve() leaves it to the process's exit
        remove_node_vms(agent.backend, node)
        agent.backend.close()
    by_name = {r.name: r for r in results}
    assert set(by_name) == {"a", "b"}
    by_worker: dict[str, list[tuple[float, float]]] = {}  # vmctld's spans of each worker's tasks
    by_vm: dict[str, list[tuple[float, float]]] = {}  # the guest's uptime at each task's start and end
    for name, res in by_name.items():
        assert [t.index for t in res.tasks] == [0, 1, 2]
        assert [t.exit_status for t in res.tasks] == ([0, 3, 0] if name == "b" else [0, 0, 0]), res.tasks
        assert res.state == ("failed" if name == "b" else "done"), res  # a task of b exited 3
        for t in res.tasks:
            assert t.worker is not None and t.start is not None and t.end is not None
            assert t.worker.startswith(f"{node}/0."), t.worker  # a worker of the libvirt host's core
            assert t.end - t.start >= SLEEP_S, f"task {name}/{t.index} ended before its sleep: {t}"
            vm, exit_code, out = outputs.seen[(res.id, t.index)]
            assert exit_code == t.exit_status
            words = out.split()  # the guest's own hostname: the VM the agent ran the task in
            assert words[:4] == ["task", f"{res.id}/{t.index}", "on", vm], out
            # /proc/uptime counts in 10 ms steps: two readings of a 2 s sleep differ by at least 1.99 s
            # (and 8.36 - 6.36 is 1.9999999999999991 in floating point)
            assert words[4] == "up" and float(words[6]) - float(words[5]) >= SLEEP_S - UPTIME_STEP_S, out
            by_worker.setdefault(t.worker, []).append((t.start, t.end))
            by_vm.setdefault(vm, []).append((float(words[5]), float(words[6])))
    # both workers of the core ran tasks (two bags: busy whatever the policy grants each), each worker
    # one task at a time, and a worker that ends a task is handed the next one in the same guest
    assert len(by_worker) == 2, by_worker
    for spans in by_worker.values():
        for (_, end), (start, _) in itertools.pairwise(sorted(spans)):
            assert start >= end, by_worker
    boots = [min(spans)[0] for spans in by_vm.values()]
    handoffs = [b[0] - a[1] for spans in by_vm.values() for a, b in itertools.pairwise(sorted(spans))]
    assert handoffs and all(h >= 0 for h in handoffs), by_vm
    print(f"\n2 bags x 3 tasks of {SLEEP_S:g} s on 2 libvirt workers: {took:.1f} s; first task started "
          f"{min(boots):.1f}-{max(boots):.1f} s after its guest's kernel started (boot + SSH up + hand-off); "
          f"task end to the next task's start in the same guest {min(handoffs):.2f}-{max(handoffs):.2f} s")
