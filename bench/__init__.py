"""Benchmarks: ``python -m bench`` runs them all, ``python -m bench.<name>`` one (see bench/__main__.py)."""
