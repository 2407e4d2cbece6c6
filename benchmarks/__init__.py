"""Benchmarks, run from the repository root as modules: `.venv/bin/python -m benchmarks.<name>`.

Run that way the repository root is on the import path, so they import `railover_testing`
and `tests` (which the installed package does not ship) without PYTHONPATH.
"""
