"""The package map of docs/DESIGN.md, enforced: imports flow one way (cli -> jobs/backend -> research ->
model and Label Studio adapters -> data -> core), the jobs and the backend do not import each other's
entry points, no module import circle (lazy imports inside functions count too), and what gets installed
lives under the one name `sense7`."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Lower rank = lower layer. A module may import its own layer's package and any lower layer.
LAYERS = {
    "sense7.settings": 0, "sense7.taxonomy": 0, "sense7.processes": 0, "sense7.files": 0, "sense7.labeling_config": 0,
    "sense7.data": 1,
    "sense7.model": 2, "sense7.labelstudio": 2,
    "sense7.research": 3,
    "sense7.tasks": 4, "sense7.ml_backend": 4, "sense7.rater_page": 4,
    "sense7.cli": 5,
}
# Siblings on one layer stay apart, but for these: pre-annotation jobs predict with the backend's model
# module (the same code that answers /predict), never with its Flask app.
# The rater page asks for deliveries (tasks.delivery) and counts failed link openings in the jobs' Redis.
ALLOWED_SIBLINGS = {("sense7.tasks", "sense7.ml_backend.model"), ("sense7.labelstudio", "sense7.model"),
                    ("sense7.rater_page", "sense7.tasks.delivery"), ("sense7.rater_page", "sense7.tasks.redis_local")}


def _package_dirs() -> dict[str, Path]:
    """Every installed sense7 package and the folder it is read from (mapped folders included)."""
    names = ["sense7", "sense7.cli", "sense7.data", "sense7.labelstudio", "sense7.model", "sense7.research",
             "sense7.labeling_config", "sense7.ml_backend", "sense7.tasks", "sense7.rater_page"]
    return {name: Path(importlib.util.find_spec(name).origin).parent for name in names}


def _modules() -> dict[str, Path]:
    modules = {}
    for package, folder in _package_dirs().items():
        for path in folder.glob("*.py"):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """sense7 modules imported anywhere in the file (top level or inside functions)."""
    found = set()
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    return {m for m in found if m.split(".")[0] in ("sense7", "tasks", "ml_backend", "labeling_config")}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> tuple[str, int] | None:
    """(group, rank) of a module; the core's modules form one group."""
    for prefix, rank in sorted(LAYERS.items(), key=lambda kv: -len(kv[0])):
        if module == prefix or module.startswith(prefix + "."):
            return ("core" if rank == 0 else prefix), rank
    return None


def test_the_map_covers_every_module():
    assert len(MODULES) > 60
    assert [m for m in MODULES if m != "sense7" and _layer(m) is None] == []


def test_nothing_imports_the_old_top_level_names():
    offenders = {m: sorted(i for i in deps if i.split(".")[0] in ("tasks", "ml_backend", "labeling_config"))
                 for m, deps in GRAPH.items()}
    assert {m: d for m, d in offenders.items() if d} == {}


def test_installed_top_level_name_is_only_sense7(tmp_path):
    """Outside the repository (where its folders are not on the path), only `sense7` is importable."""
    probe = ("import importlib.util as u; "
             "print([n for n in ('tasks', 'ml_backend', 'labeling_config') if u.find_spec(n)]); "
             "import sense7.tasks.sync, sense7.ml_backend.model, sense7.labeling_config")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_imports_flow_one_way():
    violations = []
    for module, deps in GRAPH.items():
        here = _layer(module)
        if here is None:
            continue
        for dep in deps:
            there = _layer(dep)
            if there is None or there[0] == here[0]:
                continue
            if there[1] > here[1]:
                violations.append(f"{module} (layer {here[0]}) imports higher {dep}")
            elif there[1] == here[1] and not any(module.startswith(a) and dep.startswith(b)
                                                  for a, b in ALLOWED_SIBLINGS):
                violations.append(f"{module} imports its sibling {dep}")
    assert violations == []


def test_the_jobs_never_load_the_backends_web_app():
    for module, deps in GRAPH.items():
        if module.startswith("sense7.tasks"):
            assert not deps & {"sense7.ml_backend.app", "sense7.ml_backend.wsgi", "sense7.ml_backend.server"}, module
        if module.startswith("sense7.ml_backend"):
            assert not any(d.startswith("sense7.tasks") for d in deps), module


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(GRAPH.get(node, ())):
            if dep not in GRAPH:
                continue
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circles_even_through_lazy_imports():
    assert _cycle() is None


@pytest.mark.parametrize("lower,higher", list(itertools.combinations(["sense7.data", "sense7.research", "sense7.cli"], 2)))
def test_the_checker_sees_a_planted_violation(lower, higher, monkeypatch):
    """The test above would fail if a lower layer imported a higher one (checked on a planted edge)."""
    module = next(m for m in GRAPH if m.startswith(lower + "."))
    target = next(m for m in GRAPH if m.startswith(higher + "."))
    monkeypatch.setitem(GRAPH, module, GRAPH[module] | {target})
    with pytest.raises(AssertionError):
        test_imports_flow_one_way()
