"""Packaging: the metadata setuptools builds from pyproject.toml (version from quantcore.__version__,
SPDX license and its file, the extras), `quantcore --version`, and the typed-package marker."""

from __future__ import annotations

import subprocess
import sys
from email.parser import Parser
from importlib import resources
from pathlib import Path

import pytest

import quantcore
from quantcore import cli

ROOT = Path(__file__).resolve().parents[1]
_METADATA = "from setuptools import build_meta; import sys; print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))"


@pytest.fixture(scope="module")
def metadata(tmp_path_factory):
    out = tmp_path_factory.mktemp("meta")
    run = subprocess.run([sys.executable, "-c", _METADATA, str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    return Parser().parsestr((out / run.stdout.split()[-1] / "METADATA").read_text())


def extra(metadata, name):
    return [r.split(";")[0].strip() for r in metadata.get_all("Requires-Dist") if f'extra == "{name}"' in r]


def test_version_license_and_typing_marker(metadata):
    assert metadata["Version"] == quantcore.__version__
    assert metadata["License-Expression"] == "Apache-2.0" and metadata["License-File"] == "LICENSE"
    assert "Apache License\n                           Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()
    assert resources.files("quantcore").joinpath("py.typed").is_file()


def test_extras_name_one_cuda_major_each(metadata):
    assert {"triton", "cuda12", "cuda13", "hf", "bench", "tests"} <= set(metadata.get_all("Provides-Extra"))
    cuda12, cuda13 = extra(metadata, "cuda12"), extra(metadata, "cuda13")
    names12, names13 = ({r.split(">")[0].split("<")[0] for r in reqs} for reqs in (cuda12, cuda13))
    assert names12 == {"cupy-cuda12x", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12"}
    assert names13 == {"cupy-cuda13x", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime"}
    assert "nvidia-cuda-nvrtc<14,>=13" in cuda13  # the unsuffixed NVIDIA wheels are CUDA 13 from 13.0 on
    assert any(r.startswith("safetensors") for r in extra(metadata, "hf"))
    assert {r.split(">")[0] for r in extra(metadata, "bench")} == {"matplotlib", "tqdm"}


def test_test_dependencies_are_bounded_and_spread_over_the_cores(metadata):
    """The `tests` extra pins each dependency between versions the suite is known to pass with, xdist among
    them, and pytest's options run the suite on every core by default (the README's command)."""
    import tomllib

    reqs = extra(metadata, "tests")
    assert {r.split(">")[0].split("<")[0] for r in reqs} == {"pytest", "pytest-xdist", "hypothesis", "safetensors",
                                                          "transformers", "accelerate"}
    assert all(">=" in r and "<" in r.replace("<=", "") for r in reqs), reqs
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "-n auto" in options


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"quantcore {quantcore.__version__}\n"


def test_package_data_covers_every_source_file_the_package_reads():
    """The CUDA kernels and the native extension's C++ are read at run time from the installed package:
    each non-Python file under quantcore/ matches a package-data pattern of pyproject.toml."""
    import fnmatch
    import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]
    files = [p for p in (ROOT / "quantcore").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
             and "__pycache__" not in p.parts]
    assert any(p.suffix == ".cpp" for p in files)
    assert [p.name for p in files if not any(fnmatch.fnmatch(p.name, pat) for pat in patterns)] == []
