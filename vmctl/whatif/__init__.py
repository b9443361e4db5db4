"""What if: the cluster's own history as a trace (``vmctl history export``) and its replay under other
policies on a model of the cluster (``vmctl whatif``); docs/operations.md, "What if"."""
