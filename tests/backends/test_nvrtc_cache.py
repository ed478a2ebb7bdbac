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
