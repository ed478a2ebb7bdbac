"""Benchmarks: `quantcore bench` (`run.run`: every op and backend beside its baselines; `e2e`: decode
tokens/s of a transformer; `stack_run`: real models' layer linears, the shapes in `stacks`; both time
their steps through `steps`). Importing the package imports nothing heavy: the command line reads its
vocabulary (`shapes`, `stacks`) without torch."""
