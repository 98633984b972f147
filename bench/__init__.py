"""Benchmarks: :mod:`bench.harness` and the case tables on it (one script each; see docs/benchmarks.md)."""
