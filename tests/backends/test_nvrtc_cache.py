"""The CuPy backend's NVRTC results cached on disk: a later process reads them instead of compiling,
every input of NVRTC's output is part of the key, processes compiling at once leave one whole file,
and a damaged file is compiled again."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
try:
    nvrtc.getVersion()
except Exception as exc:  # the binding imports, but libnvrtc itself is missing
    pytest.skip(f"NVRTC not loadable: {exc}", allow_module_level=True)

from quantcore import userdirs  # noqa: E402
from quantcore.backends.cupy import compiler  # noqa: E402

KERNEL = ("quant.cu", 90, ("qc::dequant_kernel<qc::Int8, float, 1>",))

# Compiles KERNEL and prints its PTX's hash; with "offline", NVRTC's compile call raises first.
_PROCESS = f"""
import hashlib, sys
from cupy_backends.cuda.libs import nvrtc
from quantcore.backends.cupy import compiler
if sys.argv[1] == "offline":
    def refuse(*args):
        raise RuntimeError("NVRTC was called")
    nvrtc.compileProgram = refuse
print(hashlib.sha256(compiler.compile_source(*{KERNEL!r}).ptx).hexdigest())
"""


def in_process(mode: str, cache) -> subprocess.Popen:
    env = {**os.environ, userdirs.CACHE_ENV: str(cache)}
    return subprocess.Popen([sys.executable, "-c", _PROCESS, mode], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out.strip()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder, nothing compiled in memory, and a count of NVRTC compilations."""
    monkeypatch.setenv(userdirs.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(compiler, "_compiled", {})
    calls = []
    real = nvrtc.compileProgram
    monkeypatch.setattr(nvrtc, "compileProgram", lambda *args: (calls.append(args), real(*args))[1])
    return tmp_path, calls


def test_a_later_process_reads_the_cache_instead_of_calling_nvrtc(tmp_path):
    first = finished(in_process("compile", tmp_path))
    assert len(list((tmp_path / "nvrtc").glob("*.json.gz"))) == 1
    assert finished(in_process("offline", tmp_path)) == first


def test_processes_compiling_at_once_leave_one_whole_file(tmp_path):
    # NVRTC names internal symbols per process, so each process's PTX differs: the file is one of them.
    outputs = {finished(p) for p in [in_process("compile", tmp_path) for _ in range(4)]}
    assert [p.name.endswith(".json.gz") for p in (tmp_path / "nvrtc").iterdir()] == [True]  # no temporary file
    assert finished(in_process("offline", tmp_path)) in outputs


def test_every_input_of_the_output_is_in_the_key(cache, monkeypatch):
    folder, calls = cache

    def compile_(*args, **kwargs):
        compiler._compiled.clear()  # the memory cache would answer first
        return compiler.compile_source(*args, **kwargs)

    expected = compile_(*KERNEL)
    assert compile_(*KERNEL) == expected and len(calls) == 1  # from disk
    variants = [
        lambda: compile_("quant.cu", 80, KERNEL[2]),  # architecture
        lambda: compile_(*KERNEL, cubin=True),  # sm_90 instead of compute_90
        lambda: compile_(*KERNEL, options=("-DQC_CACHE_TEST=1",)),  # options
        lambda: compile_(*KERNEL[:2], (*KERNEL[2], "qc::dequant_kernel<qc::Int8, float, 8>")),  # instantiations
    ]
    for vary in variants:
        vary()
    sources = {**compiler.kernel_sources(), "common.cuh": compiler.kernel_sources()["common.cuh"] + "\n// edited\n"}
    monkeypatch.setattr(compiler, "kernel_sources", lambda: sources)  # a header's text
    compile_(*KERNEL)
    monkeypatch.setattr(compiler, "nvrtc_version", lambda: (99, 0))  # NVRTC's version
    compile_(*KERNEL)
    monkeypatch.setattr(compiler, "_header_version", lambda folder: 99000)  # the CUDA headers' version
    compile_(*KERNEL)
    assert len(calls) == 1 + len(variants) + 3
    assert len(list((folder / "nvrtc").glob("*.json.gz"))) == len(calls)


def test_a_damaged_file_is_compiled_again(cache):
    folder, calls = cache
    compiler.compile_source(*KERNEL)
    (path,) = (folder / "nvrtc").glob("*.json.gz")
    path.write_bytes(path.read_bytes()[:100])
    compiler._compiled.clear()
    # Compared with this second compile, not the first: NVRTC names the module's internal symbols
    # after the clock, so two compiles seconds apart can differ in those names.
    again = compiler.compile_source(*KERNEL)
    assert again.ptx and len(calls) == 2
    compiler._compiled.clear()
    assert compiler.compile_source(*KERNEL) == again and len(calls) == 2  # rewritten whole


def test_an_unwritable_cache_folder_costs_only_the_cache(cache, monkeypatch):
    folder, calls = cache
    blocker = folder / "file"
    blocker.write_text("")
    monkeypatch.setenv(userdirs.CACHE_ENV, str(blocker))  # its "nvrtc" folder cannot be made
    ptx = compiler.compile_source(*KERNEL).ptx
    assert hashlib.sha256(ptx).hexdigest() and len(calls) == 1


def _entry(path):
    import gzip
    import json

    return json.loads(gzip.decompress(path.read_bytes()))


def _rewrite(path, data):
    import gzip
    import json

    path.write_bytes(gzip.compress(json.dumps(data).encode()))


@pytest.mark.parametrize("tamper", ["ptx", "lowered", "check", "unchecked"])
def test_a_well_formed_entry_that_is_not_what_its_check_says_is_compiled_again(cache, tamper):
    """Whole, readable files whose PTX or mangled names were changed, whose check was changed, or that carry
    none (written before checks): each is compiled again and rewritten, never launched as it is."""
    import base64

    folder, calls = cache
    first = compiler.compile_source(*KERNEL)
    (path,) = (folder / "nvrtc").glob("*.json.gz")
    data = _entry(path)
    if tamper == "ptx":
        data["ptx"] = base64.b64encode(first.ptx.replace(b".entry", b".entry ", 1)).decode()
    elif tamper == "lowered":
        data["lowered"] = {name: "_Z3bogusv" for name in data["lowered"]}
    elif tamper == "check":
        data["check"] = "0" * 64
    else:
        del data["check"]
    _rewrite(path, data)
    compiler._compiled.clear()
    again = compiler.compile_source(*KERNEL)
    assert len(calls) == 2 and again.lowered == first.lowered and b"_Z3bogusv" not in again.ptx
    assert _entry(path)["check"] == compiler._check(path.name.removesuffix(".json.gz"), again)  # rewritten
    compiler._compiled.clear()
    assert compiler.compile_source(*KERNEL) == again and len(calls) == 2


def test_an_entry_copied_under_another_compilations_name_is_compiled_again(cache):
    folder, calls = cache
    compiler.compile_source(*KERNEL)
    (source,) = (folder / "nvrtc").glob("*.json.gz")
    other = ("quant.cu", 80, KERNEL[2])  # another target: another name, the same instantiations
    compiler.compile_source(*other)
    (target,) = set((folder / "nvrtc").glob("*.json.gz")) - {source}
    target.write_bytes(source.read_bytes())  # compute_90 PTX where compute_80's is looked for
    compiler._compiled.clear()
    assert b".target sm_80" in compiler.compile_source(*other).ptx and len(calls) == 3


_PLANTED = f"""
import sys
from quantcore.backends.cupy import compiler
print(compiler.include_dirs()[0])
compiler.compile_source(*{KERNEL!r})
"""


def test_headers_never_come_from_the_running_scripts_folder(tmp_path):
    """sys.path[0] is the script's folder: an `nvidia/*/include` there is no installed CUDA wheel."""
    planted = tmp_path / "nvidia" / "cuda_runtime" / "include"
    planted.mkdir(parents=True)
    for header in ("cuda_fp16.h", "cuda_bf16.h", "cuda_runtime_api.h"):
        (planted / header).write_text('#error "a planted header was compiled"\n#define CUDART_VERSION 12090\n')
    script = tmp_path / "script.py"
    script.write_text(_PLANTED)
    # quantcore from this source tree, installed or not (the script's folder is sys.path[0], not the tree)
    tree = os.path.dirname(os.path.dirname(userdirs.__file__))
    source = os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, userdirs.CACHE_ENV: str(tmp_path / "cache"), "PYTHONPATH": source}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert str(tmp_path) not in out.stdout and out.stdout.strip().endswith("include")
