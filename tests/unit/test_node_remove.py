"""``vmctl node remove``: a node gone for good leaves the lists (and its alert) for good; a node that
holds work or is alive cannot be removed; its agent registering again brings it back, generations
continuing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_daemon_core import Cluster
from vmctl.daemon.removal import remove_node
from vmctl.errors import Conflict, exit_code_for


def test_remove_a_lost_node_only_when_it_holds_nothing(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2, "n2": 2}, node_down_s=60.0)
    jid = c.submit(2, 500, 400)
    c.run_until(lambda: c.state(jid) == "running")
    node = c.daemon.job(jid).placement[0][0]
    other = "n1" if node == "n2" else "n2"
    with pytest.raises(Conflict) as err:
        remove_node(c.daemon, other)
    assert "is ready" in err.value.message and "drain it first" in err.value.message
    assert exit_code_for(err.value) == 4
    c.down.add(node)
    c.run_until(lambda: c.daemon.node(node).state == "lost", limit=100)
    with pytest.raises(Conflict) as err:
        remove_node(c.daemon, node)  # lost, but still holds the job's processes (kept until down)
    assert f"job(s) {jid}" in err.value.message
    c.run_until(lambda: c.daemon.node(node).state == "down" and c.state(jid) == "running", limit=200)
    gen = c.daemon.state.generation[node]
    assert remove_node(c.daemon, node).name == node
    assert node not in c.daemon.state.nodes
    c.restart()  # gone from the store too
    assert node not in c.daemon.state.nodes and other in c.daemon.state.nodes
    c.daemon.register_node(node, 2, node, "mock")  # its agent comes back: the generations continue
    assert c.daemon.node(node).state == "ready"
    assert c.daemon.state.generation.get(node, 0) >= gen
    c.close()
