"""Every Python snippet of README.md and docs/*.md runs as printed, on the CPU: each block in a fresh
interpreter from the repository's root, with no GPU visible. A block whose first line is
`# requires: gpu` runs in the GPU suite instead; `# requires: torchrun` runs under
`torchrun --nproc-per-node 2` (gloo on the CPU)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _snippets():
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
            line = text[:match.start()].count("\n") + 1
            code = match.group(1)
            needs = re.match(r"# requires: (\w+)", code)
            marks = [pytest.mark.gpu] if needs and needs.group(1) == "gpu" else []
            yield pytest.param(code, needs.group(1) if needs else None, id=f"{page.name}:{line}", marks=marks)


@pytest.mark.parametrize("code,needs", list(_snippets()))
def test_snippet_runs(code, needs, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if needs != "gpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    script = tmp_path / "snippet.py"
    script.write_text(code)
    if needs == "torchrun":
        torchrun = shutil.which("torchrun")
        if torchrun is None:
            pytest.skip("torchrun is not on the PATH")
        command = [torchrun, "--standalone", "--nproc-per-node", "2", str(script)]
    else:
        command = [sys.executable, str(script)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
