"""What the hardware can do: the only module in quantcore that asks the device anything.

`profile_for(device)` returns the effective `DeviceProfile` of a tensor's device. A CUDA device can be
*simulated* as an older or newer GPU (env `QUANTCORE_SIMULATE=sm80`, or `with simulate("sm80"):`), so
that the registry picks, and the kernels run, the paths that GPU would get; the real name is kept in
`simulated_from`. The CPU is never simulated for tensors, but `report_profile()` (what the report CLI
describes) honours simulation even on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.metadata
import importlib.util
import os
from typing import TYPE_CHECKING, Any, Iterator

from pydantic import BaseModel, ConfigDict, computed_field

from .errors import InvalidInputError

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that ask the device: the command line's `--help` and
# `--version` describe the simulated profiles without loading torch.

SIMULATE_ENV = "QUANTCORE_SIMULATE"


class DeviceProfile(BaseModel):
    """Capabilities of one device, real or simulated (hashable; used as a selection-cache key)."""

    model_config = ConfigDict(frozen=True)

    kind: str  # "cpu" or "cuda"
    name: str
    index: int | None = None
    compute_capability: tuple[int, int] | None = None
    fp8_mma: bool = False  # e4m3 tensor-core MMA (sm_89+)
    int8_mma: bool = False  # s8 tensor-core MMA (sm_75+)
    bf16_mma: bool = False  # bf16 tensor-core MMA (sm_80+)
    smem_per_block: int = 0  # opt-in shared memory per block, bytes
    sm_count: int = 0
    simulated_from: str | None = None
    triton_interpreter: bool = False

    @computed_field  # type: ignore[prop-decorator]
    @property
    def versions(self) -> dict[str, str | None]:
        """torch, Triton, CuPy and NVRTC versions of this process (looked up once, on first use)."""
        return versions()

    @property
    def arch(self) -> str:
        """"sm_90" style name, or "cpu"."""
        if self.compute_capability is None:
            return "cpu"
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


def _gpu(name: str, cc: tuple[int, int], smem_kib: int, sms: int) -> DeviceProfile:
    return DeviceProfile(
        kind="cuda", name=name, index=0, compute_capability=cc,
        fp8_mma=cc >= (8, 9), int8_mma=cc >= (7, 5), bf16_mma=cc >= (8, 0),
        smem_per_block=smem_kib * 1024, sm_count=sms,
    )


# Representative GPUs of each architecture, for simulation and the report's --simulate.
SIMULATED: dict[str, DeviceProfile] = {
    "sm70": _gpu("Tesla V100 (simulated)", (7, 0), 96, 80),
    "sm75": _gpu("Tesla T4 (simulated)", (7, 5), 64, 40),
    "sm80": _gpu("A100 (simulated)", (8, 0), 163, 108),
    "sm86": _gpu("A10 (simulated)", (8, 6), 99, 72),
    "sm89": _gpu("L4 (simulated)", (8, 9), 99, 58),
    "sm90": _gpu("H100 (simulated)", (9, 0), 227, 132),
    "sm100": _gpu("B200 (simulated)", (10, 0), 227, 148),
}


def _normalize_name(name: str) -> str:
    if not isinstance(name, str):
        raise InvalidInputError(
            f"simulate: the profile name must be a str, one of cpu, {', '.join(SIMULATED)}; "
            f"got {name!r} ({type(name).__name__})"
        )
    key = name.lower().replace("_", "").replace("-", "")
    if key in SIMULATED or key == "cpu":
        return key
    raise InvalidInputError(
        f"simulate: unknown profile {name!r}; expected one of cpu, {', '.join(SIMULATED)}"
    )


def simulated_profile(name: str) -> DeviceProfile:
    """The simulated profile called `name` ("cpu", "sm70" … "sm100"; "sm_80" also accepted)."""
    key = _normalize_name(name)
    return cpu_profile() if key == "cpu" else SIMULATED[key]


# A context variable, not a thread-local: each thread and each asyncio task sees its own `simulate` blocks.
# Set only by `simulate`; read by `simulation_state` and, for its plan key, by `quantcore.dispatch`.
simulation_context: contextvars.ContextVar[str | None] = contextvars.ContextVar("quantcore_simulate", default=None)


def simulation_state() -> tuple:
    """The raw inputs of `active_simulation`: the `simulate` block in force and the environment's
    `QUANTCORE_SIMULATE` (the plan key reads both directly, `quantcore.dispatch`)."""
    return simulation_context.get(), os.environ.get(SIMULATE_ENV)


def active_simulation() -> str | None:
    """Name of the simulated profile in force (context manager first, then the environment)."""
    context, env = simulation_state()
    if context:
        return context
    env = (env or "").strip()
    return _normalize_name(env) if env else None


@contextlib.contextmanager
def simulate(name: str) -> Iterator[DeviceProfile]:
    """Within the block, CUDA devices behave as the profile `name` for selection and kernel paths."""
    key = _normalize_name(name)
    token = simulation_context.set(key)
    try:
        yield simulated_profile(key)
    finally:
        simulation_context.reset(token)


def triton_interpreter() -> bool:
    """Whether Triton kernels run on the CPU interpreter (TRITON_INTERPRET=1): hardware-only
    instructions (FP8 conversions) must then be avoided even under a simulated GPU profile."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def cpu_profile() -> DeviceProfile:
    """The CPU: no tensor cores; Triton kernels run here only under TRITON_INTERPRET=1."""
    return _cpu_profile(triton_interpreter())


@functools.lru_cache(maxsize=None)
def _cpu_profile(interpreter: bool) -> DeviceProfile:
    return DeviceProfile(kind="cpu", name="cpu", triton_interpreter=interpreter)


@functools.lru_cache(maxsize=None)
def _real_cuda_profile(index: int) -> DeviceProfile:
    import torch
    props = torch.cuda.get_device_properties(index)
    cc = (props.major, props.minor)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)
    base = _gpu(props.name, cc, 0, props.multi_processor_count)
    return base.model_copy(update={"index": index, "smem_per_block": int(smem)})


def _with_simulation(real: DeviceProfile) -> DeviceProfile:
    key = active_simulation()
    if key is None or key == "cpu":
        return real
    sim = SIMULATED[key]
    return sim.model_copy(update={"index": real.index, "simulated_from": real.name, "sm_count": real.sm_count})


def existing_device(device: Any, who: str = "profile_for", hint: str = "") -> torch.device:
    """`device` (a torch.device, "cuda:0", an index) as a torch.device, checked to name a device torch can
    make tensors on here; else `InvalidInputError` from `who` (`hint` ends the one for a missing GPU)."""
    import torch
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InvalidInputError(f"{who}: {device!r} is not a device ({err}); expected a torch.device, a string such "
                                f"as 'cpu', 'cuda' or 'cuda:0', or a CUDA device index") from None
    if device.type == "cuda" and (not cuda_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise InvalidInputError(f"{who}: no CUDA device {device} here ({torch.cuda.device_count()} visible); pass one "
                                f"that exists{hint}")
    return device


def profile_for(device: torch.device | str | int) -> DeviceProfile:
    """The effective profile of `device` (simulation applied to CUDA devices)."""
    import torch
    device = existing_device(device, hint=", or use quantcore.simulate(...) to describe another GPU")
    if device.type == "cpu":
        return cpu_profile()
    if device.type != "cuda":
        return DeviceProfile(kind=device.type, name=device.type)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _with_simulation(_real_cuda_profile(index))


def cuda_available() -> bool:
    """True when torch sees at least one CUDA device."""
    import torch
    return torch.cuda.is_available()


def report_profile() -> DeviceProfile:
    """The profile the report describes: the simulation if any, else the current GPU, else the CPU."""
    key = active_simulation()
    if key is not None:
        if cuda_available() and key != "cpu":
            return profile_for("cuda")
        return simulated_profile(key)
    return profile_for("cuda") if cuda_available() else cpu_profile()


def module_available(name: str) -> bool:
    """Whether `name` can be imported, without importing it (keeps `import quantcore` light)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> str | None:
    """NVRTC's version through CuPy's binding, or None when CuPy/NVRTC cannot be loaded."""
    if not module_available("cupy_backends"):
        return None
    try:
        from cupy_backends.cuda.libs import nvrtc

        major, minor = nvrtc.getVersion()
        return f"{major}.{minor}"
    except Exception:  # a missing libnvrtc raises various errors; the report just says "none"
        return None


@functools.lru_cache(maxsize=None)
def versions() -> dict[str, str | None]:
    """Versions of torch, Triton, CuPy, NVRTC and the CUDA torch was built with (None: missing)."""
    import torch
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": _dist_version("triton"),
        "cupy": _dist_version("cupy-cuda13x", "cupy-cuda12x", "cupy"),
        "nvrtc": nvrtc_version(),
    }


def preferred_format_name(profile: DeviceProfile) -> str:
    """What `dtype="auto"` means on `profile`: FP8 with FP8 tensor cores (and on the CPU), else INT8."""
    if profile.kind == "cuda" and not profile.fp8_mma:
        return "int8"
    return "fp8_e4m3"
