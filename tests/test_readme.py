"""The README's promises: its usage snippet runs on a CPU as printed, and CI runs the README's own
install and test commands."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_usage_snippet_runs_on_the_cpu():
    (snippet,) = blocks("python")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300, env=env,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("scaled_mm [fp8_e4m3] on cpu (cpu): runs torch")


def test_ci_runs_the_readme_commands():
    install, tests = (b.strip() for b in blocks("bash")[:2])
    ci = (ROOT / ".ci" / "run").read_text()
    assert install.endswith(" && quantcore report")
    assert install.replace("pip install", "pip install -q") in ci  # the capability report included
    assert tests in ci
