"""vmctld's decision loop: the paper's status checker + decision maker + dispatcher (001 sec. III-A.3)
around one scheduling policy (000: the policy objects of the simulator, unchanged).

``Daemon`` owns the in-memory ``ClusterState``, the store and the policy. Every change comes in as an
event -- job submitted or cancelled, agent report (a process exited, an operation confirmed), node
joined or lost, operator change, periodic tick, or the ``wake_at`` a decision asked for -- and is
written to the store in one transaction together with the desired state it implies. ``run_once``
builds a ``ClusterView``, asks the policy, checks the decision with
``vmctl.policies.invariants.check_decision`` and applies it (``Actuator``).

Crash safety: the store is written before an API call answers and in one transaction per event, with
the leader epoch checked inside it. A restarted daemon reloads the records, derives the same desired
state and picks up the agents' next full reports: a submitted job is never lost (it was committed
before ``201``), never started twice (its ``run`` number and placement were committed with the
desired state that starts it), and an open migration/checkpoint is an ``OperationRecord`` that is
confirmed from the reports or rolled back at its timeout.

The loop is synchronous (``run_once``). The API server drives it from asyncio in three steps so that
the policy does not hold up the API: ``begin_pass`` (housekeeping, then the view, on the loop),
``choose`` (the policy and the invariant check, in a worker thread: they read only that view, which
shares nothing mutable with the state), ``finish_decision`` (actuation and commit, on the loop). Events
that arrive meanwhile are handled as usual; the actuator then checks each action against the state as
it is now (a fresh view), and a decision made before a reload or a node change is dropped and made
again.

The ``Daemon`` is composed of one class per job, each in its own module:

- ``vmctl.daemon.base`` (``DaemonBase``): state, leader lease, reload, the active policy, ``commit``;
- ``vmctl.daemon.jobs`` (``JobEvents``): submit, cancel, explain;
- ``vmctl.daemon.nodes`` (``NodeEvents``): registration, reports, heartbeats, drain, desired state;
- ``vmctl.daemon.timers`` (``Timers``): node liveness, migration timeouts, estimates, retention;
- ``vmctl.daemon.decisions`` (``DecisionLoop``): the decision pass (view, policy, check, actuation);
- ``vmctl.daemon.operator_actions`` (``OperatorActions``): operator migrations and VM priority changes;
- ``vmctl.daemon.switch`` (``PolicySwitch``): a policy switch that drains and re-lays the cluster out.
"""

from __future__ import annotations

from vmctl.daemon.decisions import DecisionLoop
from vmctl.daemon.jobs import JobEvents
from vmctl.daemon.nodes import NodeEvents
from vmctl.daemon.operator_actions import OperatorActions


class Daemon(JobEvents, NodeEvents, OperatorActions, DecisionLoop):
    """vmctld's daemon: every event handler on one object (``Daemon(config, store)``, then ``start``)."""
