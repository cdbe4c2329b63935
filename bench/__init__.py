"""Benchmarks that print their figures, each run as `python -m bench.<name>` from the repository root."""
