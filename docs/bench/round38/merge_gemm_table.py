"""Rewrite a shipped measured table's GEMM rankings from a GEMM bench run, keeping the other ops' entries.

`quantcore bench --from-json RUN --write-priority DIR` writes a table of the run's ops alone; this takes its scaled_mm
entries (per M, and per K bucket: `measured.build_by_k`) into the shipped table of the same GPU model, whose source
line then names the run for them.
Usage: python3 merge_gemm_table.py RUN.json quantcore/data/priority/<slug>.json
"""
import json
import sys
import tempfile
from pathlib import Path

from quantcore.bench.run import BenchResult
from quantcore.bench.summary import write_priority

run, shipped = sys.argv[1:3]
result = BenchResult.model_validate(json.loads(Path(run).read_text()))
new = json.loads(write_priority(result, Path(tempfile.mkdtemp())).read_text())
table = json.loads(Path(shipped).read_text())
assert table["device"] == new["device"], (table["device"], new["device"])
table["priority"].update({k: v for k, v in new["priority"].items() if k.startswith("scaled_mm/")})
table["by_k"] = {k: v for k, v in new.get("by_k", {}).items() if k.startswith("scaled_mm/")}
others = table["source"].split("; scaled_mm/*")[0]  # the run the other ops' entries come from
table["source"] = f"{others}; scaled_mm/* per M and per K from {new['source']} ({run}, every implementation of a " \
    "shape timed interleaved)"
Path(shipped).write_text(json.dumps(table, indent=1) + "\n")
