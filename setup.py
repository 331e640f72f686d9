"""Which packages the wheel holds: found, never listed (pyproject.toml holds everything else).

Everything installs under the one name `sense7` (no top-level `tasks` or `ml_backend` to collide with another
project's); the repository keeps the design card's top-level folders, and each of them (with any subpackage
added later) installs as `sense7.<folder>`. A hand list once left `sense7.crowd` out of the wheel while the
editable install used by the tests still had it (issue 38); tests/wheel/test_wheel.py installs the wheel."""

from setuptools import find_namespace_packages, setup

# The design card's folders that sit beside sense7/ in the repository and install inside it.
TOP_LEVEL_FOLDERS = ("labeling_config", "ml_backend", "tasks")


def found(top: str) -> list[str]:
    """`top` and every folder below it (data folders such as rater_page/templates too, so that their files ship
    as package data; caches left out)."""
    return find_namespace_packages(include=[top, f"{top}.*"], exclude=["*__pycache__*"])


package_dir = {f"sense7.{folder}": folder for folder in TOP_LEVEL_FOLDERS}
packages = found("sense7") + [f"sense7.{name}" for folder in TOP_LEVEL_FOLDERS for name in found(folder)]

setup(packages=packages, package_dir=package_dir)
