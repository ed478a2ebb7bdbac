"""Implementations of quantcore's ops. Each backend package exposes `IMPLS`, a tuple of `Impl`
descriptors (constraints as data); kernels behind them are imported only when first launched."""

BACKEND_PACKAGES = ("triton", "cupy", "torch")
