"""Benchmarks: each prints one JSON line of figures (docs/BENCHMARKS.md records them)."""
