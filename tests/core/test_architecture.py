"""The package map of docs/DESIGN.md, enforced: imports flow one way (cli -> stack -> jobs/backend/rater page ->
research -> model and Label Studio adapters -> crowd -> readers -> privacy -> store and synthetic data -> domain
types -> core), the jobs and the backend do not import each other's entry points, the model and Label Studio
adapters do not import each other, nor the store and synthetic data, no module import circle (lazy imports
inside functions count too), what gets installed lives under the one name `sense7`, a private name
(`_x`) never crosses a module, and the benchmark scripts do not depend on the test tree."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Lower rank = lower layer. A module may import its own layer's package and any lower layer.
LAYERS = {
    "sense7.settings": 0, "sense7.taxonomy": 0, "sense7.processes": 0, "sense7.files": 0, "sense7.labeling_config": 0,
    "sense7.data": 0.5,  # domain types: conversations, rating data, model items
    "sense7.store": 1,  # the schema, the Store and the code that owns each table's rows
    "sense7.synthetic": 1,  # synthetic studies (domain types only; never the store)
    "sense7.privacy": 1.2,  # personal details, participants' choices and withdrawals, the release
    "sense7.readers": 1.3,  # user files, assistants' exports, intake into the store, research loaders
    "sense7.crowd": 1.5,  # crowd studies: participants, assignment (store only, never Label Studio)
    "sense7.model": 2, "sense7.labelstudio": 2,
    "sense7.research": 3,
    "sense7.retraining": 3.5,  # production retraining and its promotion gate: scores with research's metrics, run by the jobs
    "sense7.tasks": 4, "sense7.ml_backend": 4, "sense7.rater_page": 4,
    "sense7.stack": 4.5, "sense7.deployment": 4.5, "sense7.backup": 4.5,
    "sense7.cli": 5,
}
# Siblings on one layer stay apart, but for these: pre-annotation jobs predict with the backend's model
# module (the same code that answers /predict) through its pre-annotator, never with its Flask app.
# The rater page asks for deliveries (tasks.delivery) and counts failed link openings in the jobs' Redis.
ALLOWED_SIBLINGS = {("sense7.tasks", "sense7.ml_backend.model"), ("sense7.tasks", "sense7.ml_backend.preannotate"),
                    ("sense7.rater_page", "sense7.tasks.delivery"), ("sense7.rater_page", "sense7.tasks.crowd_jobs"), ("sense7.rater_page", "sense7.tasks.redis_local")}


def _package_dirs() -> dict[str, Path]:
    """Every installed sense7 package and the folder it is read from (mapped folders included)."""
    names = ["sense7", "sense7.cli", "sense7.data", "sense7.store", "sense7.store.migrations",
             "sense7.store.migrations.versions", "sense7.readers", "sense7.privacy",
             "sense7.synthetic", "sense7.labelstudio", "sense7.model", "sense7.research",
             "sense7.labeling_config", "sense7.ml_backend", "sense7.tasks", "sense7.rater_page", "sense7.crowd"]
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
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=120)
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
            assert not deps & {"sense7.ml_backend.app", "sense7.ml_backend.wsgi", "sense7.ml_backend.backend_process"}, module
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


@pytest.mark.parametrize("lower,higher", list(itertools.combinations(
    ["sense7.data", "sense7.store", "sense7.privacy", "sense7.readers", "sense7.research", "sense7.cli"], 2)))
def test_the_checker_sees_a_planted_violation(lower, higher, monkeypatch):
    """The test above would fail if a lower layer imported a higher one (checked on a planted edge)."""
    module = next(m for m in GRAPH if m.startswith(lower + "."))
    target = next(m for m in GRAPH if m.startswith(higher + "."))
    assert_the_checker_refuses(module, target, monkeypatch)


# Sibling packages stay apart, an import either way being a violation: layer 1's store and synthetic data
# (synthetic studies are built from domain types, never from the store), layer 2's model and Label Studio
# adapters (DESIGN.md).
@pytest.mark.parametrize("module,target", [("sense7.store.database", "sense7.synthetic.synth"),
                                           ("sense7.synthetic.synth", "sense7.store.database"),
                                           ("sense7.labelstudio.protocol", "sense7.model.serving"),
                                           ("sense7.model.serving", "sense7.labelstudio.protocol")])
def test_the_checker_sees_sibling_packages_meet(module, target, monkeypatch):
    assert_the_checker_refuses(module, target, monkeypatch)


def assert_the_checker_refuses(module: str, target: str, monkeypatch) -> None:
    """The layering test fails once `module` imports `target` (a planted edge in the import graph)."""
    monkeypatch.setitem(GRAPH, module, GRAPH[module] | {target})
    with pytest.raises(AssertionError):
        test_imports_flow_one_way()


# ---------------------------------------------------------------------------------------------------
# Private names stay in their module; scripts stand on their own

CHECKED_FOLDERS = ("sense7", "tasks", "ml_backend", "labeling_config", "scripts")
OUR_ROOTS = ("sense7", "tasks", "ml_backend", "labeling_config")
# namedtuple's public API happens to start with an underscore.
NAMEDTUPLE_API = {"_asdict", "_replace", "_fields", "_make", "_field_defaults"}
PENDING_I22B_PRIVATE: set = set()
PENDING_I22B_SCRIPTS_IMPORTING_TESTS: set = set()


def _sources() -> dict[str, str]:
    """Repository path -> source of every checked file."""
    return {str(path.relative_to(REPO)): path.read_text() for folder in CHECKED_FOLDERS
            for path in sorted((REPO / folder).rglob("*.py"))}


SOURCES = _sources()


def _package_of(path: str) -> str | None:
    """The installed package a repository file belongs to (scripts: none)."""
    parts = Path(path).with_suffix("").parts
    if parts[0] == "scripts":
        return None
    package = list(parts[:-1]) if parts[-1] != "__init__" else list(parts[:-1])
    return ".".join(package if package[0] == "sense7" else ["sense7", *package])


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_names_used(source: str, package: str | None) -> list[str]:
    """Private names of other modules this source uses: `from x import _y`, a private module of another
    package (`x._m`), and `something._y` where `_y` is neither defined in this source nor an attribute of
    `self`/`cls` (another module's function, or another class's internals)."""
    tree = ast.parse(source)
    defined = set(NAMEDTUPLE_API)
    modules = set()  # names bound to one of our modules by an import
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            defined.add(node.attr)
        elif isinstance(node, ast.Import):
            modules.update((a.asname or a.name).split(".")[0] for a in node.names
                           if a.name.split(".")[0] in OUR_ROOTS)
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in OUR_ROOTS):
            modules.update(a.asname or a.name for a in node.names)  # may be modules: checked as such below
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            ours = node.level > 0 or module.split(".")[0] in OUR_ROOTS
            if not ours:
                continue
            found += [f"line {node.lineno}: from {'.' * node.level}{module} import {a.name}"
                      for a in node.names if _private(a.name)]
            if node.level == 0 and any(_private(part) for part in module.split(".")):
                owner = module.rpartition(".")[0]
                if package != owner:
                    found.append(f"line {node.lineno}: private module {module}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in OUR_ROOTS and any(_private(p) for p in parts) \
                        and package != ".".join(parts[:-1]):
                    found.append(f"line {node.lineno}: private module {alias.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if node.attr in defined and not (isinstance(owner, ast.Name) and owner.id in modules
                                             and owner.id not in defined):
                continue
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def imports_of_the_test_tree(source: str) -> list[str]:
    """Modules of the test tree (`tests...`) that a source imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [f"line {node.lineno}: {name}" for name in names if name.split(".")[0] == "tests"]
    return found


def test_no_private_name_crosses_a_module():
    violations = []
    seen_pending = set()
    for path, source in SOURCES.items():
        for use in private_names_used(source, _package_of(path)):
            pending = [(p, name) for p, name in PENDING_I22B_PRIVATE if p == path and name in use]
            if pending:
                seen_pending.update(pending)
                continue
            violations.append(f"{path} {use}")
    assert violations == []
    assert seen_pending == PENDING_I22B_PRIVATE, "fixed: remove them from PENDING_I22B_PRIVATE"


def test_scripts_do_not_import_the_test_tree():
    """Benchmarks start what they measure themselves (a test fixture may change under them)."""
    offenders = {path: imports_of_the_test_tree(source) for path, source in SOURCES.items() if path.startswith("scripts/")}
    assert {path: uses for path, uses in offenders.items() if uses} == {}


PLANTED_PRIVATE = [
    ("sense7.labelstudio", "from sense7.data.dataset import _controls_of\n"),
    ("sense7.labelstudio", "from sense7.data import dataset\ndataset._controls_of(None, None)\n"),
    ("sense7.labelstudio", "import sense7.data.dataset as ds\nds._controls_of(None, None)\n"),
    ("sense7.model", "def scores(model, Z):\n    return model._common_prior(Z)\n"),
    ("sense7.research", "from sense7.cli._common import console\n"),
    (None, "from sense7.cli.demo import _child_env\n"),
]


@pytest.mark.parametrize("package,source", PLANTED_PRIVATE)
def test_the_private_name_checker_sees_a_planted_use(package, source, monkeypatch):
    assert private_names_used(source, package)
    monkeypatch.setitem(SOURCES, "sense7/planted.py" if package else "scripts/planted.py", source)
    with pytest.raises(AssertionError):
        test_no_private_name_crosses_a_module()


def test_the_private_name_checker_lets_a_module_use_its_own_names():
    own = ("import sense7.cli._common\nfrom sense7.cli._common import console\n"
           "def _helper():\n    return 1\n\nclass Thing:\n    def __init__(self):\n        self._x = _helper()\n"
           "    def same(self, other):\n        return other._x == self._x and self.__class__ is Thing\n"
           "Point = __import__('collections').namedtuple('Point', 'x y')\nPoint(1, 2)._asdict()\n")
    assert private_names_used(own, "sense7.cli") == []


@pytest.mark.parametrize("source", ["from tests.support.jobs import make_raters\n", "import tests.conftest\n",
                                    "def f():\n    from tests import conftest\n"])
def test_the_scripts_checker_sees_a_planted_import_of_the_tests(source, monkeypatch):
    assert imports_of_the_test_tree(source)
    monkeypatch.setitem(SOURCES, "scripts/bench_planted.py", source)
    with pytest.raises(AssertionError):
        test_scripts_do_not_import_the_test_tree()


# Tests stand alone: a test module (or a conftest) imports the test tree only through tests/support/, never
# another test module or a conftest (fixtures reach tests through conftest.py files, not through imports).

TEST_SOURCES = {str(path.relative_to(REPO)): path.read_text() for path in sorted((REPO / "tests").rglob("*.py"))}


def imports_outside_test_support(source: str) -> list[str]:
    """Imports of the test tree other than tests.support (relative imports included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            found.append(f"line {node.lineno}: {'.' * node.level}{node.module or ''} (relative)")
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"tests.{a.name}" for a in node.names] if node.module == "tests" else [node.module or ""]
        else:
            continue
        found += [f"line {node.lineno}: {name}" for name in names if name.split(".")[0] == "tests"
                  and name != "tests.support" and not name.startswith("tests.support.")]
    return found


def test_tests_import_the_test_tree_only_through_support():
    offenders = {path: imports_outside_test_support(source) for path, source in TEST_SOURCES.items()}
    assert {path: uses for path, uses in offenders.items() if uses} == {}


@pytest.mark.parametrize("source", ["from tests.jobs.conftest import job_stack\n", "from .conftest import planted_items\n",
                                    "from tests.crowd.test_flow import Flow\n", "import tests.conftest\n",
                                    "def f():\n    from tests import conftest\n", "from . import helpers\n"])
def test_the_test_tree_checker_sees_a_planted_import(source, monkeypatch):
    assert imports_outside_test_support(source)
    monkeypatch.setitem(TEST_SOURCES, "tests/crowd/test_planted.py", source)
    with pytest.raises(AssertionError):
        test_tests_import_the_test_tree_only_through_support()


def test_the_test_tree_checker_lets_tests_use_support():
    allowed = "from tests.support.crowd import write_study\nfrom tests import support\nimport tests.support.jobs\n"
    assert imports_outside_test_support(allowed) == []
