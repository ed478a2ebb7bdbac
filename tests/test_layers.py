"""The layers contract (docs/architecture.md): quantcore's packages import only the layers below them,
and no module imports itself back through others, counting imports inside functions too. Read from the
source with `ast`, so that it holds for code paths no test runs."""

from __future__ import annotations

import ast
from pathlib import Path

import quantcore

ROOT = Path(quantcore.__file__).parent

# Bottom to top; a module may import its own layer's modules and those of the layers below.
LAYERS = (
    ("quantcore.errors", "quantcore.formats", "quantcore.capability", "quantcore.userdirs", "quantcore.report_schema"),
    ("quantcore.definitions",),
    ("quantcore.registry",),
    ("quantcore.runtime",),
    ("quantcore.backends",),
    ("quantcore.library",),
    ("quantcore.ops", "quantcore.convert"),
    ("quantcore.nn",),
    ("quantcore.parallel",),
    ("quantcore.report", "quantcore.bench"),
    ("quantcore.cli", "quantcore.__main__", "quantcore"),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("quantcore", *path.relative_to(ROOT).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The quantcore modules `name` imports anywhere in its source (functions included; not the
    `if TYPE_CHECKING:` blocks, which never run)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # a first pass: ast.walk queues a node's children before yielding it
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = [ast.Pass()]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])]) if node.level else node.module
            for alias in node.names:
                full = f"{target}.{alias.name}"
                out.add(full if full in known else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _layer(module: str) -> int:
    best = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                if best is None or len(p) > best[1]:
                    best = (i, len(p))
    assert best is not None, f"{module} is in no layer of the contract; add it to LAYERS"
    return best[0]


def test_every_import_points_down():
    upward = [f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})"
              for m, deps in _graph().items() for d in deps if _layer(d) > _layer(m)]
    assert not upward, "\n".join(sorted(upward))


def test_backends_do_not_import_each_other():
    def backend(m: str) -> str | None:
        parts = m.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "backends" else None
    crossing = [f"{m} imports {d}" for m, deps in _graph().items() for d in deps
                if backend(m) and backend(d) and backend(m) != backend(d)]
    assert not crossing, "\n".join(crossing)


def test_no_import_cycles():
    graph = _graph()
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_import_quantcore_loads_neither_triton_nor_dynamo():
    """Triton and CuPy are imported when a kernel of theirs first runs, TorchDynamo when something is
    compiled: `import quantcore` (and its ~0.3 s) needs none of them."""
    import subprocess
    import sys

    code = "import sys, quantcore; print(sorted(m for m in ('triton', 'cupy', 'torch._dynamo') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
