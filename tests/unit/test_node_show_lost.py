"""issue 25 item 5: ``vmctl node show`` of a lost node said "busy: 4 fg; utilization 100%" as if live.
A lost or down node shows what its agent last observed, with the report's age, and what vmctld holds
for it (desired) beside it. The in-process daemon and agents of test_daemon_core (virtual clock)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_daemon_core import Cluster
from vmctl.api.documents import node_json, vms_json
from vmctl.cli.render import node_text


def test_a_lost_node_shows_what_it_last_observed_and_what_is_held_for_it(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 4, "n2": 4})
    jid = c.submit(4, 1000, 900)
    c.step()
    node = c.daemon.job(jid).placement[0][0]
    c.step()
    ready = node_text(node_json(c.daemon, c.daemon.node(node)))
    assert "busy: 4 fg, 0 bg; utilization 100%" in ready.splitlines()  # in contact: as before
    c.down.add(node)
    c.run_until(lambda: c.daemon.node(node).state == "lost", limit=60)
    doc = node_json(c.daemon, c.daemon.node(node))
    lines = node_text(doc, vms_json(c.daemon, node)).splitlines()
    assert not any(line.startswith("busy:") for line in lines), lines  # no live claim
    assert lines[4].startswith("lost: its agent has not been heard from since ")
    age = f"{round(doc['report_age_s'])}s ago"
    assert lines[5] == (f"last observed (its agent's last report, {age}; not live): utilization 100%, 4 VM(s) "
                        f"running a job (4 fg, 0 bg)")
    assert lines[6].startswith("desired (held for it by vmctld): 4 fg, 0 bg; its jobs keep their slots until it is "
                               "back, or down")
    c.run_until(lambda: c.daemon.node(node).state == "down", limit=400)
    lines = node_text(node_json(c.daemon, c.daemon.node(node)), vms_json(c.daemon, node)).splitlines()
    assert lines[4].startswith("down: ") and "not live" in lines[5]
    assert lines[6] == "desired (held for it by vmctld): 0 fg, 0 bg; its jobs are requeued elsewhere"
    c.close()
