"""The native launch path's description of prepared runs (`backends.base.compose` and its combinations,
`triton.direct`'s parameter slots) and its extension's fallbacks, on the CPU. Its launches run on the GPU
(tests/gpu/test_native.py)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import warnings

import pytest
import torch

from quantcore.runtime import launch as base, native
from quantcore.runtime.launch import NativeLaunch
from quantcore.backends.triton.direct import _slot

pytestmark = pytest.mark.xdist_group("native")  # one worker builds the extension (`ext`) for the run


def _run(params, outputs, launches, result):
    return base.compose(params, outputs, "    pass\n", {}, result, launches)


def test_a_composed_run_describes_its_launches_by_input_and_output():
    outputs = {"_q": base.allocator((3, 256), torch.int8, torch.device("cpu")),
               "_scale": base.transposed(base.allocator((2, 3), torch.float32, torch.device("cpu")))}
    launch = NativeLaunch(77, (4, 1, 1), (128, 1, 1), 512, ("x", None, "_scale", 5, -1, "_q"))
    run = _run("x, bias=None", outputs, lambda: [launch], "_q, _scale")
    count, (outs, launches, results, as_tuple), python_while_capturing = run.native()
    assert count == 2 and results == [0, 1] and as_tuple and not python_while_capturing
    assert outs == [((3, 256), (256, 1), torch.int8), ((3, 2), (1, 3), torch.float32)]
    assert launches == [(77, (4, 1, 1), (128, 1, 1), 512, [(1, 0), (0, 0), (2, 1), (0, 5), (0, 2**64 - 1), (2, 0)])]
    single = _run("x", {"_out": outputs["_q"]}, lambda: [launch._replace(params=("x", "_out"))], "_out")
    assert single.native()[1][3] is False  # one result, returned as it is


@pytest.mark.parametrize("launches, expected", [(None, None), (False, False)])
def test_a_run_not_yet_or_never_described(launches, expected):
    run = _run("x", {"_out": base.allocator((2,), torch.float32, torch.device("cpu"))}, lambda: launches, "_out")
    assert run.native() is expected


@pytest.mark.parametrize("params, outputs, result", [
    (("y",), {"_out": base.allocator((2,), torch.float32, torch.device("cpu"))}, "_out"),  # not a name of the run
    (("x",), {"_out": lambda: torch.empty(2)}, "_out"),  # an output it cannot allocate
    (("x",), {"_out": base.allocator((2,), torch.float32, torch.device("cpu"))}, "_out.t()"),  # a made result
])
def test_runs_the_native_path_cannot_make_are_never_described(params, outputs, result):
    run = _run("x", outputs, lambda: [NativeLaunch(1, (1, 1, 1), (32, 1, 1), 0, params)], result)
    assert run.native() is False


def _described(count, outs, launches, results, as_tuple=False):
    run = lambda *a: None  # noqa: E731
    run.native = lambda: (count, (outs, launches, results, as_tuple), False)
    return run


def test_a_composed_quant_linear_routes_the_gemm_to_act_quants_results():
    q_out = [((1, 256), (256, 1), torch.int8), ((1, 2), (2, 1), torch.float32)]
    quantize = _described(1, q_out, [(1, (1, 1, 1), (32, 1, 1), 0, [(1, 0), (2, 0), (2, 1)])], [0, 1], True)
    g_out = [((1, 64), (64, 1), torch.bfloat16)]
    gemm_params = [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (2, 0), (0, 9)]
    gemm = _described(5, g_out, [(2, (1, 1, 1), (32, 1, 1), 0, gemm_params)], [0])
    count, (outs, launches, results, as_tuple), capture = base._chained(quantize, gemm)
    assert count == 4 and outs == q_out + g_out and results == [2] and not as_tuple and not capture
    assert launches[1][4] == [(2, 0), (2, 1), (1, 1), (1, 2), (1, 3), (2, 2), (0, 9)]
    never = lambda *a: None  # noqa: E731
    assert base._chained(quantize, never) is False  # a run without a description
    pending = _described(5, g_out, [], [0])
    pending.native = lambda: None
    assert base._chained(quantize, pending) is None


def test_an_eager_only_launch_runs_in_python_while_captured():
    one = _described(4, [((1, 8), (8, 1), torch.float32)], [], [0])
    assert base._eager(one)[2] is True
    run = base.eagerly(one, one, torch.device("cpu"))
    assert run.native()[2] is True


@pytest.mark.parametrize("ty, value, slot", [
    ("*fp32", "x", "x"), ("*i8", None, None), ("*fp32", 1234, 1234), ("i32", -3, -3), ("i64", 2**40, 2**40),
    ("i1", True, 1), ("fp32", 1.5, struct.unpack("<I", struct.pack("<f", 1.5))[0]),
    ("fp64", 0.1, struct.unpack("<Q", struct.pack("<d", 0.1))[0]),
    ("fp16", 1.0, False), ("i32", "x", False), (("i32", "i32"), (1, 2), False)])
def test_triton_arguments_as_parameter_slots(ty, value, slot):
    assert _slot(ty, value) == slot


def test_without_the_extension_a_run_stays_python(monkeypatch):
    run = _run("x", {"_out": base.allocator((2,), torch.float32, torch.device("cpu"))}, lambda: [], "_out")
    assert native.replay(run, torch.device("cpu")) is run  # nothing to launch on the CPU
    monkeypatch.setenv(native.NATIVE_ENV, "0")
    assert native.module() is None and native.reason() == f"{native.NATIVE_ENV}=0"
    assert native.replay(run, torch.device("cuda", 0)) is run


@pytest.fixture(scope="module")
def cache(quantcore_cache):
    return quantcore_cache


@pytest.fixture(scope="module")
def ext(cache):
    """The extension, built from source into the run's cache folder, which starts empty (conftest's
    `quantcore_cache`; the CPU machine has no CUDA driver): one build a run, the tests that take it on
    one xdist worker (the `native` group), which builds it while the other runs other tests."""
    native._build.cache_clear()
    try:
        yield native._build()
    finally:
        native._build.cache_clear()


def test_the_report_says_how_kept_plans_are_launched(ext, cache, tmp_path, monkeypatch):
    """Without building or loading the extension: whether it is in the cache folder."""
    native._build.cache_clear()  # `ext` stays built in `cache`, not loaded
    assert native.status("cpu").startswith("Python")
    monkeypatch.setenv("QUANTCORE_CACHE_DIR", str(tmp_path))
    assert native.status("cuda").startswith("native once built")
    monkeypatch.setenv("QUANTCORE_CACHE_DIR", str(cache))  # where `ext` was built
    assert native.status("cuda").startswith("native (")
    monkeypatch.setenv(native.NATIVE_ENV, "0")
    assert native.status("cuda") == f"Python ({native.NATIVE_ENV}=0)"


def test_the_extension_runs_python_until_a_run_is_described(ext):
    """A replay calls its run, and asks for its description after each call until it gets one; None means
    not yet, anything else ends the asking, and without a driver none is taken."""
    assert isinstance(ext.driver_missing(), str)
    calls, answers = [], [None, None, (1, ([], [], [], False), False)]

    def run(x):
        calls.append(x)
        return x + 1

    replay = ext.Replay(run, lambda: answers.pop(0), 0)
    assert [replay(i) for i in range(5)] == [1, 2, 3, 4, 5] and calls == [0, 1, 2, 3, 4]
    assert answers == [] and replay.run is run
    assert replay.ready is (ext.driver_missing() == "")
    assert not native.replayed(run)  # a Python run, which the custom ops' kernels must not keep


def test_the_native_kernels_hand_python_what_its_kernels_get(ext):
    """The custom ops' native kernels, installed for the CPU on a copy of act_quant's schema: a call without
    a kept replay (CPU tensors never have one) reaches the Python kernel with the schema's arguments as
    Python's kernels get them (dtypes as torch.dtype, lists, floats), its result pushed as the op's; a
    call that needs autograd reaches the Autograd kernel instead."""
    import quantcore
    from quantcore import ops

    lib = torch.library.Library("qcnative_test", "DEF")
    schema = str(torch.ops.quantcore.act_quant.default._schema).split("::", 1)[1]
    lib.define(schema)
    seen = []

    def miss(args):
        seen.append(("miss", args))
        return ops.act_quant(args[0], dtype=args[1], group_size=args[2]), None, 0

    def record(args):
        seen.append(("record", args))
        return ops.act_quant(args[0].detach(), dtype=args[1], group_size=args[2])
    ext.install("qcnative_test", "act_quant", miss, record, 2, "CPU", "AutogradCPU")
    x = torch.randn(3, 256)
    q, s = torch.ops.qcnative_test.act_quant(x, dtype=torch.int8, group_size=64, eps=1e-3)
    expected = ops.act_quant(x, dtype=torch.int8, group_size=64)
    assert torch.equal(q, expected[0]) and torch.equal(s, expected[1])
    (kind, args), = seen
    names = [a.name for a in torch.ops.quantcore.act_quant.default._schema.arguments]
    given = dict(zip(names, args))
    assert kind == "miss" and given["x"] is not None and torch.equal(given["x"], x)
    assert given["dtype"] is torch.int8 and given["group_size"] == 64 and given["eps"] == 1e-3
    assert given["backend"] is None and isinstance(given["scale_layout"], str)
    seen.clear()
    torch.ops.qcnative_test.act_quant(x.requires_grad_(True))
    with torch.no_grad():
        torch.ops.qcnative_test.act_quant(x)
    assert [k for k, _ in seen] == ["record", "miss"]
    ext.install("qcnative_test", "act_quant", lambda args: ops.act_quant(args[0], group_size=0), record, 2,
                "CPU", "AutogradCPU")
    with pytest.raises(quantcore.InvalidInputError, match="group_size"):  # the Python kernel's error, as raised
        torch.ops.qcnative_test.act_quant(x.detach())


def test_the_cli_builds_the_extension_ahead(ext, cache, monkeypatch, capsys):
    from quantcore import cli

    monkeypatch.setenv("QUANTCORE_CACHE_DIR", str(cache))  # where `ext` was built: found, loaded
    assert cli.main(["native"]) == 0
    out = capsys.readouterr().out
    assert f"built {cache}" in out and "launch path: Python" in out  # no GPU here
    monkeypatch.setenv(native.NATIVE_ENV, "0")
    assert cli.main(["native"]) == 2 and "QUANTCORE_NATIVE=0" in capsys.readouterr().err


def test_a_failed_build_warns_once_and_leaves_calls_in_python(monkeypatch, tmp_path):
    @functools.lru_cache(maxsize=None)  # as `_build`: `module()` asks whether it has loaded (it has not)
    def fail():
        raise OSError("no C++ compiler\ncc: not found")
    monkeypatch.setenv("QUANTCORE_CACHE_DIR", str(tmp_path))  # nothing built there
    monkeypatch.setattr(native, "_build", fail)
    monkeypatch.setattr(native, "_failure", None)
    monkeypatch.setattr(native, "_background", [])
    run = _run("x", {"_out": base.allocator((2,), torch.float32, torch.device("cpu"))}, lambda: [], "_out")
    with pytest.warns(UserWarning, match="could not be built .OSError: cc: not found"):
        with pytest.warns(UserWarning, match="in the background"):  # the first call does not wait for the build
            assert native.replay(run, torch.device("cuda", 0)) is run
        assert native.wait(60)
    assert native.reason() == "OSError: cc: not found" and native.status("cuda") == "Python (OSError: cc: not found)"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not again
        assert native.replay(run, torch.device("cuda", 0)) is run


# A process that builds and loads the extension as `quantcore native` does, its build stood in for by a copy
# of the one `ext` built (argv[1]; "fail": a build that raises): the real one takes 30-80 s a time here.
_REBUILD = """
import shutil, sys
from pathlib import Path
from torch.utils import cpp_extension

def load(name, sources, build_directory, **_):
    print("rebuilt")
    if sys.argv[1] == "fail":
        raise RuntimeError("no C++ compiler")
    so = Path(build_directory) / (name + ".so")
    shutil.copyfile(sys.argv[1], so)
    from quantcore.runtime import native
    return native._import(name, so)

cpp_extension.load = load
from quantcore import cli
from quantcore.runtime import native
if sys.argv[2] == "cli":
    sys.exit(cli.main(["native"]))
first = native.module()  # a build the cache lacks starts in the background: wait for it, then ask again
native.wait()
print("module", first is not None or native.module() is not None, native.reason())
"""


def _damaged_copy(cache, tmp_path, damage):
    """A copy of `cache` whose extension is damaged by `damage` (its path -> None); (the copy, the extension's
    path in it, the intact extension's path)."""
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    so = next((copy / "native").glob("*/quantcore_native_*.so"))
    damage(so)
    return copy, so, next((cache / "native").glob("*/quantcore_native_*.so"))


def _flipped(data, at):
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


DAMAGES = {
    "truncated": lambda so: so.write_bytes(so.read_bytes()[:so.stat().st_size // 3]),  # SIGBUS once mapped
    "garbage": lambda so: so.write_bytes(bytes(range(256)) * 100),
    "empty": lambda so: so.write_bytes(b""),
    "one byte changed": lambda so: so.write_bytes(_flipped(so.read_bytes(), so.stat().st_size // 2)),
    "no record": lambda so: so.with_suffix(".json").unlink(),
}


def test_a_build_records_the_extensions_size_and_hash(ext, cache):
    so = next((cache / "native").glob("*/quantcore_native_*.so"))
    record = json.loads(so.with_suffix(".json").read_text())
    assert record == {"size": so.stat().st_size, "sha256": hashlib.sha256(so.read_bytes()).hexdigest()}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_extension_is_rebuilt_not_loaded(ext, cache, tmp_path, damage):
    """Checked against its build's record before it is mapped: rebuilt, with one warning naming it, never a
    crash (the process's return code would show a SIGBUS) nor a failing import."""
    copy, so, intact = _damaged_copy(cache, tmp_path, DAMAGES[damage])
    env = {**os.environ, "QUANTCORE_CACHE_DIR": str(copy)}
    out = subprocess.run([sys.executable, "-W", "always", "-c", _REBUILD, str(intact), "cli"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("rebuilt") == 1 and f"built {so}" in out.stdout
    assert out.stderr.count("not loading its native extension") == 1 and str(so) in out.stderr
    assert so.read_bytes() == intact.read_bytes()
    assert json.loads(so.with_suffix(".json").read_text()) == json.loads(intact.with_suffix(".json").read_text())


def test_a_damaged_extension_that_cannot_be_rebuilt_leaves_calls_in_python(ext, cache, tmp_path):
    copy, so, _ = _damaged_copy(cache, tmp_path, DAMAGES["truncated"])
    env = {**os.environ, "QUANTCORE_CACHE_DIR": str(copy)}
    out = subprocess.run([sys.executable, "-W", "always", "-c", _REBUILD, "fail", "module"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "module False RuntimeError: no C++ compiler" in out.stdout
    assert out.stderr.count("not loading its native extension") == 1 and str(so) in out.stderr
    assert out.stderr.count("could not be built") == 1
