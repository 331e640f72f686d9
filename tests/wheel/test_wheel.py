"""What installs is what runs: the wheel, installed NON-editable into a fresh virtualenv, holds every module of
the source tree, imports each of them, and runs `sense7 --help` and a crowd study's entry on the rater page.

The rest of the suite runs against the editable install (`./run setup`), which finds modules in the source
tree whatever pyproject.toml says; a hand list of packages once left `sense7.crowd` out of the wheel that
`pip install .` (docker-compose) installs, and no other test could see it (issue 38).

No download: the wheel is built with the test venv's setuptools (--no-build-isolation, --no-index) and the new
virtualenv sees .venv's site-packages for the dependencies only (a .pth file placed after its own
site-packages), so `sense7` itself can only come from the wheel, which the test asserts."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from tests.support.crowd import write_study

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PID = "5f3a9c0d1e2b4a6c8d0e1f2a"


def top_level_folders() -> tuple[str, ...]:
    """setup.py's TOP_LEVEL_FOLDERS (read, not run: running setup.py would build)."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TOP_LEVEL_FOLDERS":
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("setup.py names no TOP_LEVEL_FOLDERS")


def source_modules() -> set[str]:
    """Every module the source tree has, by the name it installs under."""
    names = set()
    roots = [(ROOT / "sense7", "sense7")] + [(ROOT / folder, f"sense7.{folder}") for folder in top_level_folders()]
    for folder, prefix in roots:
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            names.add(".".join((prefix, *parts)))
    return names


def run(args, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{args[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel built from this tree installed in it (not editable); its folder."""
    work = tmp_path_factory.mktemp("wheel")
    # Build from a copy, so that the build leaves no build/ or egg-info behind in the working tree.
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for folder in ("sense7", *top_level_folders()):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         str(source), "-w", str(work / "dist")])
    wheels = list((work / "dist").glob("sense7-*.whl"))
    assert len(wheels) == 1, wheels

    venv = work / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
         "--no-index", str(wheels[0])])
    purelib = Path(run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       cwd=work).stdout.strip())
    # The dependencies (not sense7: .venv has it as an editable finder, which a plain path entry never runs).
    (purelib / "zz_sense7_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def clean_env(tmp_path: Path) -> dict[str, str]:
    """No PYTHONPATH, no SENSE7_* of the caller: a private home and store."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SENSE7_", "PYTHON"))}
    return {**env, "SENSE7_HOME": str(tmp_path / "home"), "SENSE7_STORE_URL": f"sqlite:///{tmp_path / 'store.sqlite'}"}


def test_the_wheel_holds_and_imports_every_module_of_the_tree(installed, tmp_path):
    walk = textwrap.dedent("""
        import importlib, json, pkgutil, sys
        import sense7
        names, failed = ["sense7"], {}
        for found in pkgutil.walk_packages(sense7.__path__, "sense7."):
            names.append(found.name)
            try:
                importlib.import_module(found.name)
            except Exception as exc:
                failed[found.name] = repr(exc)
        files = {name: getattr(sys.modules.get(name), "__file__", None) or "" for name in names}
        print(json.dumps({"names": names, "failed": failed, "files": files}))
    """)
    # Run from a folder outside the tree: the current folder must not put the source's sense7/ on the path.
    done = run([str(installed / "bin" / "python"), "-c", walk], cwd=tmp_path, env=clean_env(tmp_path))
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["failed"] == {}
    installed_names = {name for name in report["names"]}
    assert source_modules() - installed_names == set(), "modules of the source tree missing from the wheel"
    assert "sense7.crowd.lifecycle" in installed_names and "sense7.ml_backend.app" in installed_names
    outside = {name: path for name, path in report["files"].items()
               if path and not Path(path).resolve().is_relative_to(installed.resolve())}
    assert outside == {}, "imported from outside the new virtualenv (not from the wheel)"
    assert Path(report["files"]["sense7"]).resolve().is_relative_to(installed.resolve())


def test_the_installed_command_answers_help(installed, tmp_path):
    done = run([str(installed / "bin" / "sense7"), "--help"], cwd=tmp_path, env=clean_env(tmp_path))
    for command in ("demo", "crowd", "import", "rater-page"):
        assert command in done.stdout


def test_the_installed_rater_page_lets_a_participant_enter_a_crowd_study(installed, tmp_path):
    """The installed `sense7 crowd init/open`, then gunicorn's app factory answers the study's entry with its
    consent page (templates shipped as package data, the crowd blueprint imported from the wheel)."""
    env = clean_env(tmp_path)
    study = write_study(tmp_path / "study")
    run([str(installed / "bin" / "sense7"), "crowd", "init", str(study)], cwd=tmp_path, env=env)
    run([str(installed / "bin" / "sense7"), "crowd", "open", "pilot"], cwd=tmp_path, env=env)
    enter = textwrap.dedent(f"""
        import json
        import sense7.rater_page.wsgi as wsgi
        client = wsgi.app_from_env().test_client()
        page = client.get("/s/pilot?PROLIFIC_PID={PID}&STUDY_ID=65aa11bb22cc33dd44ee55ff&SESSION_ID=sess1")
        unknown = client.get("/s/nosuchstudy?PROLIFIC_PID={PID}&STUDY_ID=65aa11bb22cc33dd44ee55ff&SESSION_ID=s2")
        print(json.dumps({{"file": wsgi.__file__, "status": page.status_code, "html": page.get_data(as_text=True),
                          "unknown": unknown.status_code}}))
    """)
    done = run([str(installed / "bin" / "python"), "-c", enter], cwd=tmp_path, env=env)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(answer["file"]).resolve().is_relative_to(installed.resolve())
    assert answer["status"] == 200
    assert "I agree" in answer["html"] and "You will rate replies of an AI assistant" in answer["html"]
    assert answer["unknown"] == 404
