"""Experiments: every sweep and evaluation as a grid of pure cells on Dask, and their results.

- ``runner``: the one runner: cells (a pure function and its inputs), run on a local or an existing Dask
  cluster, recorded in one results table that a rerun resumes from (docs/experiments.md).
- ``sweep``: the simulator's parameter sweep (policies x workloads x loads x seeds), ``vmctl sim sweep``
  and ``vmctl sim run`` build their workloads and runs with it.
- ``vcsched``: the vcsched evaluation suite (``vmctl vcsched eval``): algorithms on generated virtual-
  cluster instances, Markdown tables and plots.

All use the simulator, the policies and the model only (never the daemon, store, API or agents).
"""
