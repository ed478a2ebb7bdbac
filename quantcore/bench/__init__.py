"""Benchmarks: `quantcore bench` and `quantcore.bench.run()`. Imports nothing heavy until run."""

from .run import BenchResult, Record, run

__all__ = ["run", "BenchResult", "Record"]
