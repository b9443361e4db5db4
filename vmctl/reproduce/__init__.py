"""``vmctl reproduce``: each paper's headline claims beside ours, with verdicts and the experiments behind them.

- ``base``: Claim, Outcome, Estimate, the verdict rules, Experiment, Size, Paper (how a paper module
  declares its claims and experiments: see its docstring);
- ``registry``: paper id -> module (a module not in this build is reported as such, never faked);
- ``run``: runs a paper's experiments on the experiment runner (resuming) and evaluates its claims;
- ``output``: ``claims.md`` and ``claims.parquet``;
- ``docs``: docs/reproduction.md from the ``claims.parquet`` of several runs;
- ``p000`` ... ``p004``: one module per paper.
"""
