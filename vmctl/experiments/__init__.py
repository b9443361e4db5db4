"""Evaluation runners: experiments that run many simulations or solver instances and write results.

- ``sweep``: the simulator's parameter sweep (policies x workloads x loads x seeds), ``vmctl sim sweep``
  and ``vmctl sim run`` build their workloads and runs with it.
- ``vcsched``: the vcsched evaluation suite (``vmctl vcsched eval``): algorithms on generated virtual-
  cluster instances, Markdown tables and plots.

Both use the simulator, the policies and the model only (never the daemon, store, API or agents).
"""
