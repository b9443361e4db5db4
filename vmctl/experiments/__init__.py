"""Experiments: grids of pure cells run on Dask and their result tables (see docs/experiments.md)."""
