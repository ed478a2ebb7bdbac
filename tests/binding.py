"""What selection names is what runs: a spy on the launches the dispatcher makes (which `Impl`, and
which keyword arguments beyond the op's contract it passed: the Impl's fixed `options`, its variant),
and the check that `explain()`, `select()` and the spied launch agree on a call (each op's `OpDef.example`).
Used on the CPU (tests/test_binding.py), under the Triton interpreter
(tests/backends/test_triton_kernels.py) and on a GPU (tests/gpu/test_binding_gpu.py)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import quantcore
from quantcore import UnsupportedError, definitions, registry
from quantcore.registry.impl import Impl


def simulate_on_cpu(monkeypatch, name: str) -> None:
    """Make CPU tensors report the simulated profile `name` ("cpu": the CPU's own), as a CUDA device
    does under `quantcore.simulate`, with Triton and CuPy counted as installed."""
    from quantcore import capability
    from quantcore.registry import impl as base

    for module in (capability, base):
        monkeypatch.setattr(module, "module_available", lambda _: True)
    if name != "cpu":
        sim = capability.simulated_profile(name).model_copy(update={"simulated_from": "the CPU"})
        monkeypatch.setattr(capability, "profile_for", lambda device: sim)


def choices(op: str) -> list[str | None]:
    """`backend=` values to try for `op`: automatic, each backend and each variant by name."""
    impls = registry.impls(op)
    return [None, *dict.fromkeys([i.backend for i in impls] + [i.label for i in impls])]


class LaunchSpy:
    """Records each launch function the dispatcher obtains and calls: (the Impl, the keyword
    arguments it received beyond its op's launch arguments). `stub(impl)`, if given, replaces the
    launch (for backends that cannot run here)."""

    def __init__(self, monkeypatch, stub: Callable[[Impl], Callable[..., Any]] | None = None):
        self.calls: list[tuple[Impl, dict[str, Any]]] = []
        self.real = Impl.function
        spy = self

        def function(impl: Impl) -> Callable[..., Any]:
            launch = stub(impl) if stub else spy.real(impl)
            contract = set(definitions.get(impl.op).launch_args)

            def seen(kwargs: dict[str, Any]) -> None:
                spy.calls.append((impl, {k: v for k, v in kwargs.items() if k not in contract}))

            def recorded(**kwargs: Any) -> Any:
                seen(kwargs)
                return launch(**kwargs)
            if hasattr(launch, "prepare"):
                def prepare(**kwargs: Any) -> Any:
                    seen(kwargs)
                    return launch.prepare(**kwargs)
                recorded.prepare = prepare  # type: ignore[attr-defined]
            return recorded

        monkeypatch.setattr(Impl, "function", function)

    def reference_stub(self, impl: Impl) -> Callable[..., Any]:
        """A stand-in launch computing the reference's result from the contract's arguments."""
        contract = definitions.get(impl.op).launch_args
        reference = self.real(registry.reference(impl.op))
        return lambda **kwargs: reference(**{k: kwargs[k] for k in contract})


def check_binding(spy: LaunchSpy, op: str, args: tuple, kwargs: dict, backend: str | None) -> tuple[Impl | None, Any]:
    """Run `op` with `backend=` and assert that `explain()` and `select()` name one implementation
    and that the dispatcher launched that very Impl with exactly its fixed options (or, where
    nothing can run, that both say so and nothing was launched). Returns (the Impl, the output)."""
    explained = quantcore.explain(op, *args, backend=backend, **kwargs)
    try:
        chosen = registry.select(definitions.get(op).spec(*args, **kwargs).query, backend)
    except UnsupportedError:
        chosen = None
    assert explained.selected == (chosen.label if chosen else None), (op, backend, str(explained))
    registry.clear_caches()  # no kept plan from an earlier call: the dispatcher selects and launches anew
    spy.calls.clear()
    run = getattr(quantcore.ops, op)
    if chosen is None:
        with pytest.raises(UnsupportedError):
            run(*args, backend=backend, **kwargs)
        assert spy.calls == []
        return None, None
    out = run(*args, backend=backend, **kwargs)
    # Launches of other ops are the implementation's own calls through quantcore.ops
    # (torch[bf16_dequant] dequantizes its operands so): this op's dispatch launched one.
    own = [call for call in spy.calls if call[0].op == op]
    assert len(own) == 1, spy.calls
    launched, passed = own[0]
    assert launched is chosen, (launched, chosen)
    assert passed == dict(chosen.options) == explained.options, (passed, chosen.options, explained.options)
    return chosen, out


def spy_triton_gemms(monkeypatch) -> list[dict]:
    """The constants of every Triton GEMM kernel launch prepared from now on (imports Triton)."""
    from quantcore.backends.triton import launch

    seen, real = [], launch.Launcher

    def recording(kernel, grid, constants, device, descriptors=None, fixed=()):
        if kernel in (launch.block_scaled_mm_kernel, launch.decode_mm_kernel):
            seen.append(constants)
        return real(kernel, grid, constants, device, descriptors, fixed)
    monkeypatch.setattr(launch, "Launcher", recording)
    return seen


def kernel_mma(constants: dict) -> str:
    """The MMA a Triton GEMM kernel was compiled for, from its constants."""
    return "int8" if constants["QFMT"] == "int8" else "fp8" if constants["USE_FP8_MMA"] else "fp16"
