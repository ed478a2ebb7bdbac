"""quantcore's ops made callable: each op's public function (`FUNCTIONS`, generated from its definition
by `runtime.entry`; `quantcore.ops` lists them) and its `torch.library` custom ops, for `torch.compile`
and `torch.export`.

Importing this module registers `torch.ops.quantcore.<name>` for act_quant, act_dequant,
weight_quant, weight_dequant, scaled_mm, scaled_mm_quant (the re-quantized-output GEMM: one op per
return type, where `ops.scaled_mm` returns either), quant_linear, dequant_bias, quantized_gelu, and
for mixture-of-experts layers grouped_mm, grouped_mm_masked (each with its `_quant` twin, as
scaled_mm), moe_permute, moe_permute_masked and moe_unpermute.
`import quantcore` imports it, so a program saved with `torch.export.save` loads in a process that
imports quantcore alone; registering costs about 10 ms of the import, which torch's own second
dominates.

Each op takes the same arguments as its `quantcore.ops` function, with these differences, all forced
by the schema language: dtypes are `torch.dtype` values ("auto" is resolved by the caller, e.g.
`quantcore.nn`); `block_size` is a list of two ints; `backend` is None (automatic), one backend name
or a comma-separated priority ("cupy,triton"). The real kernel calls `quantcore.ops`, so validation
and backend selection happen at run time on the real tensors: a graph compiled for one M serves
every M, and selection may still depend on M. The fake kernel derives the outputs from the inputs'
shapes alone, as the backend contract (docs/backend-contract.md) defines them: every output is
contiguous except the M-major activation scale, the transpose view of a contiguous [ceil(K/G), M]
buffer. Invalid arguments are reported when the real kernel runs, with the error `quantcore.ops` raises.

The ops are defined on a `torch.library.Library` with a kernel per dispatch key (the real one for
every backend, an Autograd one above it, a fake for tracing) rather than `torch.library.custom_op`,
whose Python wrappers run on every call: an inference call pays one redispatch below autograd.

Autograd (a `torch.autograd.Function` recorded by the Autograd kernel, formulas in
`quantcore.definitions.gradients`): `quant_linear` gives x and bias gradients, `scaled_mm` bias; their other
tensor arguments (quantized codes and scales) are refused in the forward when they require grad. The other ops are
not differentiable: their outputs never require grad, as a cast to an integer dtype's do not. `quantcore.ops` runs
through these custom ops when grad mode is on and an input requires grad, so eager calls get the
same gradients (`call_with_gradient`).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

import torch

from . import definitions
from .definitions import BUILTIN, checks
from .definitions.op import CustomOp, OpDef, register_op, requires_grad, unregister_op
from .definitions.schema import BACKEND_ARG
from .errors import InvalidInputError
from .formats import dtype_name
from .runtime import entry, native
from .runtime.dispatch import call, kept
from .runtime.plans import PLAIN_TENSORS

NAMESPACE = "quantcore"


def _backend(name: str | None):
    """The schema's `str?` backend as `quantcore.ops` takes it: a string with a comma is a priority
    tuple ("cupy,triton"; "triton," is a priority of one, which falls back to the reference)."""
    if name is not None and "," in name:
        return tuple(part.strip() for part in name.split(",") if part.strip())
    return name


def _real(op: OpDef, custom: CustomOp, schema_tensors: list[str]) -> Callable[..., Any]:
    """The real kernel: the op's public function without its question about gradients (its
    `entry.Functions.kernel`: it runs below autograd), its outputs in the fake's layout. Tensors arrive as the
    schema orders them (`schema_tensors`, its positional arguments), which must be the function's order: those the
    function takes positionally go on so, the others (scaled_mm's keyword-only bias, positional in the schema) by
    name."""
    function, layout = FUNCTIONS[op.name].kernel, custom.layout
    params = list(inspect.signature(function).parameters.values())[:len(op.tensors)]
    kinds = [p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params]
    leading = [p.name for p in params]
    if schema_tensors != list(op.tensors) or leading != list(op.tensors) or kinds != sorted(kinds, reverse=True):
        raise InvalidInputError(f"{custom.name}: the schema's positional arguments {schema_tensors} and the "
                                f"function's first ones {leading} must both be the op's tensors {list(op.tensors)}, "
                                "the function's positional ones first")
    positional = sum(kinds)
    by_name = op.tensors[positional:]

    def unlaid(*tensors, backend=None, **options):
        backend = _backend(backend)
        if len(tensors) > positional:
            return function(*tensors[:positional], backend=backend, **dict(zip(by_name, tensors[positional:])),
                            **options)
        return function(*tensors, backend=backend, **options)

    def kernel(*tensors, **options):
        return layout(unlaid(*tensors, **options), options)
    kernel.unlaid = unlaid  # its outputs before `layout`, for the native kernel (`_native_kernels`)
    return kernel


def _refuse_undefined(op: OpDef, custom: CustomOp, tensors: tuple) -> None:
    """Raise `InvalidInputError` for a tensor argument that requires grad but has no gradient."""
    gradient = custom.gradient
    refused = [n for n, t in zip(op.tensors, tensors) if n not in gradient.inputs and requires_grad(t)]
    if refused:
        one = len(refused) == 1
        raise InvalidInputError(
            f"{op.name}: {' and '.join(refused)} require{'s' if one else ''} grad, but {op.name} has no gradient "
            f"with respect to quantized codes or their scales; only {' and '.join(gradient.inputs)} get gradients"
            f"{gradient.hint}. Freeze {'it' if one else 'them'} (.requires_grad_(False)), or call under "
            "torch.no_grad() for inference")


def _only_real_below(tensors: tuple) -> bool:
    """Whether dispatching these arguments below autograd would run the real kernel and nothing else: each
    tensor a plain one (not fake, functional or another subclass, which the Python key takes) off the meta
    device (whose kernel is the fake) and no dispatch mode active (a mode sees every op below autograd; a
    TorchScript trace records the op above autograd, test_library checks both)."""
    for t in tensors:
        if t is not None and (type(t) not in PLAIN_TENSORS or t.is_meta):
            return False
    return not torch._C._len_torch_dispatch_stack()


def _autograd(op: OpDef, custom: CustomOp, overload: torch._ops.OpOverload,
              real: Callable[..., Any]) -> Callable[..., Any]:
    """The op's Autograd kernel. Without an input that requires grad (inference) it calls the real
    kernel `real` itself where the dispatcher below autograd would run nothing else (`_only_real_below`),
    saving the redispatch and its second boxing of the arguments into Python, else redispatches:
    `torch.library.custom_op`'s wrappers, which did this before, cost ~14 µs more a call on the CPU
    machine. Otherwise it
    records a `torch.autograd.Function` whose backward is the op's `Gradient`; an op without one
    marks its outputs non-differentiable. The dispatcher passes
    a Python kernel only the arguments given: the `Gradient` gets every keyword-only one, the
    absent at the public function's defaults (which the schema's mirror)."""
    gradient = custom.gradient
    defaults = {a.name: op.defaults.get(a.name) for a in overload._schema.arguments if a.kwarg_only}

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, options, *tensors):
            with torch._C._AutoDispatchBelowAutograd():
                out = overload(*tensors, **options)
            if gradient is None:
                ctx.mark_non_differentiable(*(out if isinstance(out, tuple) else (out,)))
            else:
                ctx.save_for_backward(*tensors)
                ctx.options = {**defaults, **options}
            return out

        @staticmethod
        def backward(ctx, grad, *_):
            if gradient is None:  # outputs marked non-differentiable: autograd asks for no gradient
                return (None,) * len(ctx.needs_input_grad)
            names = op.tensors[:len(ctx.saved_tensors)]  # a trailing optional tensor may be absent (None)
            needs = {n for n, need in zip(names, ctx.needs_input_grad[1:]) if need}
            given = dict.fromkeys(op.tensors) | dict(zip(names, ctx.saved_tensors))
            got = gradient.backward(given, ctx.options, grad, needs)
            return (None, *(got.get(n) for n in names))

    Function.__name__ = Function.__qualname__ = f"{custom.name}_autograd"

    def kernel(*tensors, **options):
        if torch.is_grad_enabled() and requires_grad(*tensors):
            if gradient is not None:
                _refuse_undefined(op, custom, tensors)
            return Function.apply(options, *tensors)
        if _only_real_below(tensors):
            return real(*tensors, **options)
        with torch._C._AutoDispatchBelowAutograd():
            return overload(*tensors, **options)
    return kernel


def _native_kernels(op: OpDef, custom: CustomOp, overload: torch._ops.OpOverload, real: Callable[..., Any],
                    autograd: Callable[..., Any]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(miss, record) for `backends.native`'s CUDA and AutogradCUDA kernels of this op, each taking the call's
    arguments as one tuple in the schema's order. `miss` runs the real kernel and returns (its outputs, the
    native replay of the call's kept plan or None, how many leading arguments that replay takes): a plan
    replayed as it is, its outputs already in the fake's layout. `record` is the Autograd kernel."""
    names = [a.name for a in overload._schema.arguments]
    count = sum(not a.kwarg_only for a in overload._schema.arguments)

    def split(args: tuple) -> tuple[tuple, dict[str, Any]]:
        return args[:count], dict(zip(names[count:], args[count:]))

    def miss(args: tuple) -> tuple[Any, Any, int]:
        tensors, options = split(args)
        unlaid = real.unlaid(*tensors, **options)
        out = custom.layout(unlaid, options)
        same = out is unlaid or (isinstance(out, tuple) and all(a is b for a, b in zip(out, unlaid)))
        plan = kept(op.name, tensors, {k: v for k, v in options.items() if k != "backend"},
                    _backend(options.get("backend"))) if same else None
        if plan is None or plan.direct is None or plan.finish is not None or not native.replayed(plan.launch):
            return out, None, 0
        return out, plan.launch, plan.direct

    def record(args: tuple) -> Any:
        tensors, options = split(args)
        return autograd(*tensors, **options)
    return miss, record


_LIBRARY = torch.library.Library(NAMESPACE, "DEF")


def _register(op: OpDef, custom: CustomOp) -> torch._ops.OpOverload:
    """Define `torch.ops.quantcore.<custom.name>`: the real kernel for every backend, the Autograd kernel
    above it and the fake kernel for tracing. Returns its overload."""
    _LIBRARY.define(custom.name + op.schema(custom))
    overload = getattr(torch.ops.quantcore, custom.name).default
    real = _real(op, custom, [a.name for a in overload._schema.arguments if not a.kwarg_only])
    autograd = _autograd(op, custom, overload, real)
    _LIBRARY.impl(custom.name, real, "CompositeExplicitAutograd")
    _LIBRARY.impl(custom.name, autograd, "Autograd")
    torch.library.register_fake(overload, custom.fake, lib=_LIBRARY)
    miss, record = _native_kernels(op, custom, overload, real, autograd)
    returns = len(overload._schema.returns)
    native.on_load(lambda ext: ext.install(NAMESPACE, custom.name, miss, record, returns))
    return overload


FUNCTIONS: dict[str, entry.Functions] = {}  # op name -> its generated functions
CUSTOM_OPS: dict[str, torch._ops.OpOverload] = {}


class Route(NamedTuple):
    """How a `quantcore.ops` call is made as the custom op that serves it (`CustomOp.serves`): `overload`
    called with the call's tensors positionally and, by keyword, the options it takes (`options`: the
    schema's keyword-only arguments but the backend), those of them the schema types as a dtype (`dtypes`:
    "auto" is the caller's to resolve) and the op's other options (`unused`: the schema omits them, as
    the call's options that make no difference to it, but they are validated all the same)."""

    custom: CustomOp
    overload: torch._ops.OpOverload
    options: tuple[str, ...]
    dtypes: tuple[str, ...]
    unused: tuple[str, ...]


ROUTES: dict[str, tuple[Route, ...]] = {}  # op name -> its custom ops' routes


def _route(op: OpDef, custom: CustomOp, overload: torch._ops.OpOverload) -> Route:
    keywords = [a for a in overload._schema.arguments if a.kwarg_only and a.name != BACKEND_ARG]
    dtypes = tuple(a.name for a in keywords if "ScalarType" in str(a.real_type))
    taken = {a.name for a in keywords}
    return Route(custom, overload, tuple(a.name for a in keywords), dtypes,
                 tuple(n for n in op.defaults if n not in taken))


def _define(op: OpDef) -> Callable[..., Any]:
    FUNCTIONS[op.name] = entry.generate(op, call_with_gradient, as_custom_op)
    for custom in op.custom_ops:
        CUSTOM_OPS[custom.name] = _register(op, custom)
    ROUTES[op.name] = tuple(_route(op, c, CUSTOM_OPS[c.name]) for c in op.custom_ops)
    return FUNCTIONS[op.name].public


def define(op: OpDef) -> Callable[..., Any]:
    """Add an op from outside quantcore: registered for selection, `explain` and the report, its custom
    ops defined as `torch.ops.quantcore.<name>`, and its public function returned (generated from its spec,
    as `quantcore.ops`' are). Its implementations are added with `registry.register`."""
    register_op(op)
    return _define(op)


def undefine(op: OpDef) -> None:
    """Forget an op added with `define` (its custom ops stay defined: torch.library cannot drop them)."""
    unregister_op(op)
    FUNCTIONS.pop(op.name, None)
    ROUTES.pop(op.name, None)


def _schema_backend(backend: Any) -> Any:
    """`quantcore.ops`'s backend argument as the schema's `str?`: a priority list joined by commas,
    with a trailing one so that a list of one stays a priority (`_backend`)."""
    if isinstance(backend, (list, tuple)) and all(isinstance(b, str) for b in backend):
        return ",".join(backend) + ","
    return backend


def _serving(name: str, tensors: tuple, options: dict[str, Any]) -> Route:
    """The route of the custom op of `name` that serves a call with `tensors` and `options`."""
    arguments = {**dict(zip(definitions.get(name).tensors, tensors)), **options}
    for route in ROUTES[name]:
        if route.custom.serves(arguments):
            return route
    raise InvalidInputError(f"{name}: none of its custom ops {[r.custom.name for r in ROUTES[name]]} serves "
                            f"a call with options {options}")


def _given(value: Any, default: Any) -> bool:
    """Whether an option differs from its default in type or value (validation tells 128 from 128.0)."""
    return value is not default and (type(value) is not type(default) or value != default)


def _constant_result(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`torch.compiler.assume_constant_result(fn)` without importing TorchDynamo, which that function does and
    which would make `import quantcore` import Triton and Inductor: the mark it sets, read when Dynamo traces."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


# Run by TorchDynamo at trace time on the call's constant options, not traced: they read the device's
# profile and validate with numpy, and what they return is a constant of the graph.
@_constant_result
def _check_unused(name: str, unused: tuple[tuple[str, Any], ...], dtype: torch.dtype) -> bool:
    """Raise what `quantcore.ops.<name>` raises for an invalid option among `unused` ((name, value) pairs
    the custom op does not take), by running the op's spec on its example call in the format of `dtype`
    (the call's first tensor's), with these options given. An op without an example is not checked."""
    op = definitions.get(name)
    if op.example is not None:
        fmt = dtype_name(dtype) if dtype_name(dtype) in op.formats else op.formats[0]
        args, kwargs = op.example(fmt)
        op.spec(*args, **{**kwargs, **dict(unused)})
    return True


@_constant_result
def _auto_dtype(name: str, option: str, value: str, device: torch.device) -> torch.dtype:
    """The quantized dtype that `value` ("auto") means for option `option` of `name` on `device`."""
    return checks.quant_format(name, option, value, device).dtype


def as_custom_op(name: str, tensors: tuple, options: dict[str, Any], backend: Any) -> Any:
    """`quantcore.ops.<name>` called as the custom op that serves it, with the schema's arguments: a dtype
    option's "auto" resolved for the first tensor's device, a backend priority joined by commas. What the
    schema omits is validated here (`_check_unused`); the rest, with the tensors, by the custom op's real
    kernel when it runs. The public function calls it when TorchDynamo or a non-strict `torch.export`
    traces it, so that the graph holds the custom op: the trace reads no shape (M stays dynamic) and
    nothing but constants decides the route."""
    route = _serving(name, tensors, options)
    defaults = definitions.get(name).defaults
    unused = tuple((n, options[n]) for n in route.unused if _given(options[n], defaults[n]))
    if unused:
        _check_unused(name, unused, tensors[0].dtype)
    kwargs = {n: options[n] for n in route.options}
    for n in route.dtypes:
        if isinstance(kwargs[n], str):
            kwargs[n] = _auto_dtype(name, n, kwargs[n], tensors[0].device)
    return route.overload(*tensors, **kwargs, backend=_schema_backend(backend))


def call_with_gradient(name: str, tensors: tuple, options: dict[str, Any], backend: Any) -> Any:
    """`quantcore.ops.<name>` called with grad mode on and an input that requires grad: validated as
    the plain call is (same errors, before anything runs), then run through the custom op that serves it
    (`as_custom_op`), so that autograd records it. A call whose custom op has no `Gradient` (`scaled_mm`
    with `out_quant`) runs plainly: its outputs never require grad."""
    op = definitions.get(name)
    op.prepare(tensors, options)
    custom = _serving(name, tensors, options).custom
    if custom.gradient is None or not (backend is None or isinstance(_schema_backend(backend), str)):
        return call(name, tensors, options, backend)  # a bad backend: the plain path names what is wrong
    _refuse_undefined(op, custom, tensors)
    return as_custom_op(name, tensors, options, backend)


for _op in BUILTIN:
    _define(_op)
