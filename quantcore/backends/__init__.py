"""Implementations of quantcore's ops: `torch` (the reference), `triton` and `cupy`. Each backend package
exposes `IMPLS`, a tuple of `registry.Impl` descriptors (constraints as data), and holds its launch
functions and kernels, imported only when one is first launched. Nothing here selects or dispatches."""
