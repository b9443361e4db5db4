"""``vmctl demo``: a whole vmctl cluster on this machine, running a Feitelson-model workload.

What it does, in order (everything it starts, it stops, by pid):

1. makes a state directory (temporary unless ``--state-dir``);
2. starts ``vmctld`` with SQLite on a free loopback port (TLS with its own cluster CA; a bootstrap admin
   token written to the state directory) and waits for its ``vmctld ready port=N`` line;
3. issues a client certificate per node through the API (``POST /v1/certs``) and starts one
   ``vmctl-agent`` per node on the mock backend, each with its own Prometheus endpoint; the mock agents
   share a fabric directory, so the daemon's live migrations really move VMs (with their job's
   progress) between the agent processes. ``--backend libvirt``: the agents use the local libvirtd and
   run each job process over SSH in its own real guest (``guests``: the SSH guest built or reused, the
   agents' SSH runner, the clean-up of every domain of the run);
4. runs everything on an accelerated clock: vmctld and the mock agents get ``clock: {speed, epoch}``
   (``--speed`` model seconds per real second from one shared epoch), so daemon timestamps, the mock
   processes' progress and the workload's own times are all model seconds;
5. generates a Feitelson (1996) workload (``vmctl.sim.workloads.generate_model``: TModel estimates,
   the paper's CPU usage per process), in model seconds; when its arrivals would not fit into the
   first half of ``--duration`` they are squeezed further, and run times are capped at a third of it;
6. submits the jobs at their arrival times and shows a live view (nodes with fg/bg occupancy, running
   jobs with tier and placement, migrations as they happen, the metrics URL);
7. prints a summary: response time and bounded slowdown in model seconds, jobs by final state,
   migrations; then stops the agents and the daemon (and, with libvirt, removes every domain of its nodes).

The processes run as ``python -m vmctl.daemon.main`` / ``python -m vmctl.agents.main`` with this
interpreter, so the demo works from a checkout's virtualenv without the console scripts on PATH.
The demo talks to the daemon only through its HTTP API (``vmctl.apiclient``).

The child processes (vmctld, agents, their configs) come from the local cluster library
``vmctl.localcluster``. Modules: ``workload`` (the generated jobs), ``guests`` (real guests for
``--backend libvirt``), ``view`` (the live view), ``summary`` (the closing numbers, with the
simulator's bounded slowdown), ``command`` (the ``Demo`` run and the click command). Importing this
package imports none of them.
"""
