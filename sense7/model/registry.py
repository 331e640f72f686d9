"""The on-disk model registry: trained versions and the pointer to the one being served.

Layout under `settings.model_dir`::

    CURRENT              the served version's name (one line), replaced atomically with os.replace
    v3/                  one directory per version: the bundle files (sense7.model.bundle.save_bundle),
      metrics.json       the bundle's metrics
      MANIFEST.json      size + sha256 of every other file; written last, so it marks a complete version
    .staging-v4-1a2b/    a version being written (renamed to v4/ in one step when complete)

A version is loadable only when its MANIFEST exists and every file matches it, so a half-copied or
truncated model can never be loaded: serving processes keep the version they have instead.
Serving processes watch `pointer_stamp()` (one stat call) to notice a promotion without a restart.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from sense7.files import fsync_dir, sha256_of

POINTER_NAME = "CURRENT"
MANIFEST_NAME = "MANIFEST.json"
METRICS_NAME = "metrics.json"
STAGING_PREFIX = ".staging-"
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_NUMBERED_RE = re.compile(r"^v(\d+)$")


class RegistryError(RuntimeError):
    """A version is missing, incomplete or corrupt, or a name is not a valid version name."""


@dataclass(frozen=True)
class ModelVersion:
    name: str
    path: Path
    created_at: float
    metrics: dict = field(default_factory=dict)
    current: bool = False


def _default_loader(path: Path) -> Any:
    # Imported lazily: the registry is usable (listing, pruning, promoting) without the model stack.
    from sense7.model.bundle import load_bundle

    return load_bundle(path)


def _default_saver(bundle: Any, path: Path) -> None:
    from sense7.model.bundle import save_bundle

    save_bundle(bundle, path)


def check_version_name(name: str) -> str:
    """Version names become directory names and HTTP model_version strings: keep them plain."""
    if not isinstance(name, str) or not _VERSION_RE.match(name) or name == POINTER_NAME:
        raise RegistryError(
            f"invalid model version name {name!r}: use letters, digits, '.', '_' or '-' (at most 64, no '/')")
    return name


class ModelRegistry:
    """Versions of the served model under one directory, and the atomic `CURRENT` pointer.

    `loader(path) -> bundle` and `saver(bundle, path)` default to sense7.model.bundle's
    load_bundle/save_bundle; they are parameters so the registry does not care what a bundle is.
    """

    def __init__(self, model_dir: str | Path, loader: Callable[[Path], Any] | None = None,
                 saver: Callable[[Any, Path], None] | None = None):
        self.model_dir = Path(model_dir)
        self.loader = loader or _default_loader
        self.saver = saver or _default_saver

    # ------------------------------------------------------------------ paths and names
    @property
    def pointer_path(self) -> Path:
        return self.model_dir / POINTER_NAME

    def path(self, version: str) -> Path:
        return self.model_dir / check_version_name(version)

    def next_version(self) -> str:
        """'v<n+1>' after the highest numbered version present ('v1' for an empty registry)."""
        numbers = [int(m.group(1)) for p in self._version_dirs() if (m := _NUMBERED_RE.match(p.name))]
        return f"v{max(numbers, default=0) + 1}"

    def _version_dirs(self) -> list[Path]:
        if not self.model_dir.is_dir():
            return []
        return [p for p in self.model_dir.iterdir()
                if p.is_dir() and not p.name.startswith(".") and _VERSION_RE.match(p.name)]

    # ------------------------------------------------------------------ writing versions
    def add(self, bundle: Any, version: str | None = None, metrics: dict | None = None) -> ModelVersion:
        """Save `bundle` as a new version (not promoted). The directory appears complete or not at all."""
        version = check_version_name(version or getattr(bundle, "version", None) or self.next_version())
        final = self.path(version)
        if final.exists():
            raise RegistryError(f"model version {version!r} already exists in {self.model_dir}")
        self.model_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{version}-", dir=self.model_dir))
        try:
            self.saver(bundle, staging)
            if metrics is None:
                metrics = getattr(bundle, "metrics", None) or {}
            (staging / METRICS_NAME).write_text(json.dumps(metrics, indent=2, sort_keys=True, default=str))
            self._write_manifest(staging, version)
            fsync_dir(staging)
            os.rename(staging, final)  # atomic on one file system; fails if `final` appeared meanwhile
            fsync_dir(self.model_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return self._describe(final, self.current())

    def seal(self, version: str) -> None:
        """Write the manifest of a version directory someone filled in place (e.g. save_bundle directly).

        The directory's files are checked by loading them first, so a broken bundle is never sealed.
        """
        path = self.path(version)
        if not path.is_dir():
            raise RegistryError(f"model version {version!r} not found in {self.model_dir}")
        self.loader(path)
        if not (path / METRICS_NAME).exists():
            (path / METRICS_NAME).write_text("{}")
        self._write_manifest(path, version)

    def _write_manifest(self, path: Path, version: str) -> None:
        files = {}
        for file in sorted(p for p in path.rglob("*") if p.is_file() and p.name != MANIFEST_NAME):
            files[file.relative_to(path).as_posix()] = {"size": file.stat().st_size, "sha256": sha256_of(file)}
        manifest = {"version": version, "created_at": time.time(), "files": files}
        tmp = path / f".{MANIFEST_NAME}.tmp"
        with open(tmp, "w") as fh:
            json.dump(manifest, fh, indent=2, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path / MANIFEST_NAME)

    # ------------------------------------------------------------------ reading versions
    def verify(self, version: str) -> dict:
        """Return the manifest, or raise RegistryError if the version is incomplete or any file differs."""
        path = self.path(version)
        manifest_path = path / MANIFEST_NAME
        if not manifest_path.exists():
            raise RegistryError(f"model version {version!r} is incomplete: {manifest_path} is missing")
        try:
            manifest = json.loads(manifest_path.read_text())
            files = manifest["files"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RegistryError(f"model version {version!r}: unreadable manifest {manifest_path} ({exc})") from None
        if not files:
            raise RegistryError(f"model version {version!r}: manifest lists no files")
        for rel, expected in files.items():
            file = path / rel
            if not file.is_file():
                raise RegistryError(f"model version {version!r} is incomplete: {file} is missing")
            if file.stat().st_size != expected["size"] or sha256_of(file) != expected["sha256"]:
                raise RegistryError(f"model version {version!r} is corrupt: {file} does not match its manifest")
        return manifest

    def load(self, version: str) -> Any:
        """Verify, then load. Raises RegistryError for an incomplete/corrupt version."""
        self.verify(version)
        try:
            return self.loader(self.path(version))
        except Exception as exc:
            raise RegistryError(f"model version {version!r} failed to load: {type(exc).__name__}: {exc}") from exc

    def metrics(self, version: str) -> dict:
        try:
            return json.loads((self.path(version) / METRICS_NAME).read_text())
        except (OSError, ValueError):
            return {}

    def _describe(self, path: Path, current: str | None) -> ModelVersion:
        try:
            created = json.loads((path / MANIFEST_NAME).read_text()).get("created_at") or path.stat().st_mtime
        except (OSError, ValueError):
            created = path.stat().st_mtime
        return ModelVersion(path.name, path, float(created), self.metrics(path.name), path.name == current)

    def list_versions(self) -> list[ModelVersion]:
        """Complete versions (those with a manifest), oldest first."""
        current = self.current()
        found = [self._describe(p, current) for p in self._version_dirs() if (p / MANIFEST_NAME).exists()]
        return sorted(found, key=lambda v: (v.created_at, v.name))

    # ------------------------------------------------------------------ the serving pointer
    def current(self) -> str | None:
        try:
            name = self.pointer_path.read_text().strip()
        except FileNotFoundError:
            return None
        return name or None

    def pointer_stamp(self) -> tuple[int, int, int] | None:
        """A cheap fingerprint of the pointer (one stat): it changes whenever `promote` runs."""
        try:
            st = os.stat(self.pointer_path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def promote(self, version: str) -> ModelVersion:
        """Point CURRENT at `version` after verifying and test-loading it; serving processes follow."""
        self.load(version)
        self.model_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".CURRENT-", dir=self.model_dir)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(version + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)  # the owner only, as every data file of a home (mkstemp makes it so; kept explicit)
            os.replace(tmp, self.pointer_path)  # readers see the old name or the new one, never half
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        fsync_dir(self.model_dir)
        return self._describe(self.path(version), version)

    def remove(self, version: str) -> bool:
        """Delete one version (never the current one: RegistryError). True when it was there."""
        check_version_name(version)
        if version == self.current():
            raise RegistryError(f"{version} is being served: promote another version first")
        path = self.path(version)
        if not path.exists():
            return False
        shutil.rmtree(path)
        return True

    def prune(self, keep: int = 3) -> list[str]:
        """Delete all but the newest `keep` complete versions (never the current one) and stale staging
        directories (older than an hour: a trainer may still be writing a younger one)."""
        if keep < 1:
            raise RegistryError("prune: keep must be at least 1")
        versions = self.list_versions()
        current = self.current()
        keep_names = {v.name for v in versions[-keep:]} | {current}
        removed = []
        for v in versions:
            if v.name not in keep_names:
                shutil.rmtree(v.path, ignore_errors=True)
                removed.append(v.name)
        if self.model_dir.is_dir():
            for p in self.model_dir.iterdir():
                if p.is_dir() and p.name.startswith(STAGING_PREFIX) and time.time() - p.stat().st_mtime > 3600:
                    shutil.rmtree(p, ignore_errors=True)
        return removed
