"""The package's layers: no module imports from a layer above its own, no modules import each other round a circle,
the re-export modules of the old layout are gone, and the functional core imports no Lightning.

Imports are read from the source with ``ast``, those inside functions included and those under
``if TYPE_CHECKING:`` left out (they never run). ``from package import name`` imports the module
``package.name`` where there is one, else ``package``. Circles are looked for between modules (a package's
``__init__`` is the module of its name); layers are subpackages and top-level modules, lowest first.
"""
from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_nsv"

LAYERS = [
    ("lightning_nsv.errors", "lightning_nsv.threads", "lightning_nsv.memory", "lightning_nsv.atomic",
     "lightning_nsv.ticks", "lightning_nsv.validate", "lightning_nsv.models.layers"),  # the activation family, read by the core
    ("lightning_nsv.solver",),
    ("lightning_nsv.kernel",),
    ("lightning_nsv.plotting",),
    ("lightning_nsv.analysis", "lightning_nsv.extract", "lightning_nsv.experiment_io"),
    ("lightning_nsv.scope",),  # what an analysis looks at: the head or the whole module
    ("lightning_nsv.artifacts",),
    ("lightning_nsv.compare",),
    ("lightning_nsv.compat", "lightning_nsv.models", "lightning_nsv.datamodules"),
    ("lightning_nsv.callbacks",),
    ("lightning_nsv.cli", "lightning_nsv.cli_checkpoint", "lightning_nsv.cli_help", "lightning_nsv.cli_profile",
     "lightning_nsv.experiments"),
]
REMOVED = ("path_space", "max_margin", "support_vectors", "multiclass", "sharded", "psi", "valley")
LIGHTNING_FREE = ("lightning_nsv.kernel", "lightning_nsv.solver", "lightning_nsv.analysis", "lightning_nsv.scope",
                  "lightning_nsv.artifacts", "lightning_nsv.compare")


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _run_time_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports."""
    targets = set()
    for node in _run_time_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            for alias in node.names:
                targets.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module)
    found = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name and target.split(".")[0] == "lightning_nsv":
            found.add(target)
    return found


@functools.lru_cache(maxsize=None)
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(name: str) -> int | None:
    """The index in LAYERS of the longest prefix that names ``name`` or a package holding it."""
    matches = [(len(prefix), index) for index, prefixes in enumerate(LAYERS) for prefix in prefixes
               if name == prefix or name.startswith(prefix + ".")]
    return max(matches)[1] if matches else None


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, on_stack, stack, circles = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_the_re_export_modules_of_the_old_layout_are_gone():
    assert [name for name in REMOVED if (PACKAGE / f"{name}.py").exists()] == []


def test_every_module_has_a_layer():
    assert [name for name in _graph() if name != "lightning_nsv" and _layer(name) is None] == []


def test_no_module_imports_from_a_layer_above_its_own():
    graph = _graph()
    upward = [f"{name} (layer {_layer(name)}) imports {target} (layer {_layer(target)})"
              for name, targets in sorted(graph.items()) if name != "lightning_nsv"
              for target in sorted(targets) if target != "lightning_nsv" and _layer(target) > _layer(name)]
    assert upward == []


def test_no_modules_import_each_other_round_a_circle():
    assert [sorted(circle) for circle in _circles(_graph())] == []


def test_the_reading_of_imports_finds_circles_and_leaves_type_checking_out():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [{"a", "b", "c"}]
    modules = _modules()
    values = _imports("lightning_nsv.kernel.pair_values", modules["lightning_nsv.kernel.pair_values"], modules)
    assert "lightning_nsv.kernel.pair_code" in values and "lightning_nsv.kernel.pair_program" not in values
    psi_result = _imports("lightning_nsv.analysis.psi_result", modules["lightning_nsv.analysis.psi_result"], modules)
    assert "lightning_nsv.plotting" in psi_result  # imported inside a method


def test_the_functional_core_imports_no_lightning():
    code = ("import importlib, json, sys\n"
            "found = {}\n"
            f"for name in {list(LIGHTNING_FREE)!r}:\n"
            "    importlib.import_module(name)\n"
            "    found[name] = sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning'))\n"
            "print(json.dumps(found))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {name: [] for name in LIGHTNING_FREE}
