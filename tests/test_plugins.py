"""Out-of-tree backends through the `quantcore.backends` entry points: a fake distribution on
sys.path declares them. A working plugin's implementations join the table (callable and named
launches alike) and run where a priority names their backend; a broken one is reported by
`explain()`, errors and the report, never raised by `import quantcore` or selection."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import quantcore
from quantcore import UnsupportedError, ops, registry, report
from quantcore.registry import plugins

GOOD = '''
from quantcore.backends import torch as reference
from quantcore.registry.impl import Constraints, Impl

CALLS = []


def act_quant(x, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile):
    CALLS.append("act_quant")
    return reference.act_quant(x, qdtype=qdtype, group_size=group_size, ue8m0=ue8m0, eps=eps,
                               scale_m_major=scale_m_major)


IMPLS = (Impl("act_quant", "fakegood", act_quant, Constraints(devices=("cpu",))),
         Impl("act_dequant", "fakegood", "qc_fake_good_launch:act_dequant", Constraints(devices=("cpu",))))
'''
GOOD_LAUNCH = '''
from quantcore.backends import torch as reference
from qc_fake_good import CALLS


def act_dequant(q, scale, *, group_size, out_dtype, profile):
    CALLS.append("act_dequant")
    return reference.act_dequant(q, scale, group_size=group_size, out_dtype=out_dtype)
'''
MISSING_LIBRARY = 'raise ImportError("needs libfake, which is not installed")\n'
WRONG_SIGNATURE = '''
from quantcore.registry.impl import Constraints, Impl

IMPLS = (Impl("act_quant", "fakesig", lambda x, *, layout: None, Constraints(devices=("cpu",))),)
'''
NO_IMPLS = "VERSION = 1\n"

MODULES = {"qc_fake_good": GOOD, "qc_fake_good_launch": GOOD_LAUNCH, "qc_fake_import": MISSING_LIBRARY,
           "qc_fake_sig": WRONG_SIGNATURE, "qc_fake_none": NO_IMPLS}
ENTRY_POINTS = {"fakegood": "qc_fake_good", "fakeimport": "qc_fake_import", "fakesig": "qc_fake_sig",
                "fakenone": "qc_fake_none"}


def write_distribution(root: Path) -> None:
    """A distribution at `root` (a sys.path entry) declaring ENTRY_POINTS, with MODULES beside it."""
    info = root / "qc_fake_plugins-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: qc-fake-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{plugins.GROUP}]\n" + "".join(f"{name} = {target}\n" for name, target in ENTRY_POINTS.items()))
    for name, source in MODULES.items():
        (root / f"{name}.py").write_text(source)


@pytest.fixture
def installed(tmp_path):
    """The fake distribution on sys.path, the registry's table loaded afresh; all gone afterwards."""
    write_distribution(tmp_path)
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    registry.reset()
    try:
        yield
    finally:
        sys.path.remove(str(tmp_path))
        for name in MODULES:
            sys.modules.pop(name, None)
        registry.reset()


def test_a_plugin_backend_joins_the_table_and_runs_where_a_priority_names_it(installed):
    x = torch.randn(2, 256)
    status = {p.name: p for p in registry.plugin_status()}
    assert status["fakegood"].impls == 2 and status["fakegood"].error is None
    candidates = {c.impl: c.reasons for c in quantcore.explain("act_quant", x).candidates}
    assert candidates["fakegood"] == ["not in the priority list"]
    calls = sys.modules["qc_fake_good"].CALLS
    q, s = ops.act_quant(x)  # automatic selection keeps to the defaults
    assert calls == []
    with quantcore.priority("fakegood"):
        assert torch.equal(ops.act_quant(x)[0], q)
        assert quantcore.explain("act_quant", x).selected == "fakegood"
    # a launch named "module:function" with an absolute module, resolved on first launch
    assert torch.equal(ops.act_dequant(q, s, backend="fakegood"), ops.act_dequant(q, s, backend="torch"))
    assert calls == ["act_quant", "act_dequant"]


def test_broken_plugins_are_reported_not_raised(installed):
    x = torch.randn(2, 256)
    q, s = ops.act_quant(x)  # selection works
    explained = quantcore.explain("act_quant", x)
    broken = explained.broken_plugins
    assert set(broken) == {"fakeimport", "fakesig", "fakenone"}
    assert broken["fakeimport"] == "ImportError: needs libfake, which is not installed"
    assert "does not take ['qdtype'" in broken["fakesig"] and "requires ['layout']" in broken["fakesig"]
    assert "qc_fake_none must be a module with IMPLS" in broken["fakenone"]
    assert "plugin fakeimport failed to load: ImportError: needs libfake" in str(explained)
    with pytest.raises(UnsupportedError) as err:
        ops.act_quant(x, backend="fakeimport")
    assert err.value.reasons == {"fakeimport": ["plugin failed to load: " + broken["fakeimport"]]}
    with quantcore.priority("fakeimport"):  # a known name: its priority list still selects the reference
        assert torch.equal(ops.act_quant(x)[0], q)
    built = report.build()
    assert {p.name: p.error for p in built.plugins if p.error} == broken
    assert "plugin fakesig (qc_fake_sig): failed to load: InvalidInputError: " in report.render(built)
    assert "fakesig" not in {i.backend for i in registry.impls("act_quant")}


def test_entry_points_are_read_once_until_reset(installed, monkeypatch):
    loads = []
    real = plugins.load
    monkeypatch.setattr(plugins, "load", lambda: loads.append(1) or real())
    registry.reset()
    for _ in range(3):
        quantcore.explain("act_quant", torch.randn(2, 128))
    assert len(loads) == 1
    registry.reset()
    quantcore.explain("act_quant", torch.randn(2, 128))
    assert len(loads) == 2


def test_import_quantcore_survives_broken_plugins_and_loads_none_before_first_use(tmp_path):
    write_distribution(tmp_path)
    root = Path(quantcore.__file__).parents[1]
    script = ("import sys, torch, quantcore\n"
              "assert 'qc_fake_good' not in sys.modules and 'qc_fake_import' not in sys.modules\n"
              "print(quantcore.explain('act_quant', torch.randn(2, 128)))\n"
              "assert 'qc_fake_good' in sys.modules\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(root)]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "plugin fakeimport failed to load: ImportError: needs libfake" in done.stdout
    assert "fakegood" in done.stdout
