"""Test helpers shared by the tests and the benchmarks (``python -m bench.X`` from the repository root):
not part of the product package, so the wheel ships no PostgreSQL launcher and ``vmctl/`` never
imports from here (tests/unit/test_import_boundaries.py)."""
