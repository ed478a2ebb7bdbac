"""Benchmarks: `quantcore bench` (`run.run`: every op and backend beside its baselines; `e2e`: decode
tokens/s of a transformer). Importing the package imports nothing heavy: the command line reads its
vocabulary (`shapes`) without torch."""
