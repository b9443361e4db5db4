"""``vmctl node remove``: forget a node that is gone for good (a lost node otherwise stays in every
list, and its ``VmctlAgentLost`` alert fires, forever).

Only a node that holds nothing may go: its state is ``lost``, ``down`` or ``drained`` (drain a live
node first), no job has a process placed on it, and no open operation moves a process to or from
it. The node's row leaves the store in one transaction; its desired row and generation stay, so an
agent that registers the name again continues its generations instead of seeing them restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vmctl.errors import Conflict
from vmctl.store.base import NodeRecord, WriteBatch

if TYPE_CHECKING:
    from vmctl.daemon.base import DaemonBase

REMOVABLE = ("lost", "down", "drained")


def remove_node(d: DaemonBase, name: str) -> NodeRecord:
    d._require_leader()
    rec = d.node(name)
    what = f"node {name}"
    if rec.state not in REMOVABLE:
        hint = "drain it first (vmctl node drain)" if rec.state == "ready" else "wait until it is drained"
        raise Conflict(what=what, problem=f"is {rec.state}: only a lost, down or drained node can be removed; {hint}")
    jobs = d.state.jobs_on(name)
    if jobs:
        ids = ", ".join(j.id for j in jobs[:10]) + (f" (+{len(jobs) - 10})" if len(jobs) > 10 else "")
        raise Conflict(what=what, problem=f"still holds processes of job(s) {ids}: cancel or requeue them first")
    for op in d.state.ops.values():
        if op.state != "pending":
            continue
        nodes = {str(m["from"][0]) for m in op.detail.get("moves", [])} | \
            {str(m["to"][0]) for m in op.detail.get("moves", [])}
        if name in nodes:
            raise Conflict(what=what, problem=f"operation {op.id} (job {op.job_id}) still moves a process there")
    d.events.add(d.clock.now(), "node.removed", f"node {name} removed (was {rec.state})", node=name)
    d.store_write(WriteBatch(delete_nodes=[name], events=d.events.take()))
    st = d.state
    del st.nodes[name]
    st.observed.pop(name, None)
    st.agent_errors.pop(name, None)
    d.observed_at.pop(name, None)
    st.nodes_changed()
    d.dirty = True
    return rec
