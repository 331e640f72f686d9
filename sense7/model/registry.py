"""The model registry: trained versions and the pointer to the one being served, kept in the store's database.

Each version is one row of the store (`sense7.store.model_versions`): the bundle's files (what
sense7.model.bundle.save_bundle writes, plus `metrics.json`) as one tar blob, its SHA-256, its metrics; one more
row points at the served version. So the ML backend, the worker and the rater page may run on hosts that share
nothing but the store (SQLite or PostgreSQL): no `models/` folder is shared any more.

`model_dir` is each process's own cache, never shared::

    cache/<sha256>/      a version's files, unpacked from the blob whose SHA-256 names the folder
      MANIFEST.json      size + sha256 of every other file; written last, checked before every load
    .staging-v4-1a2b/    a version being written, or a blob being unpacked (renamed into cache/ when complete)

A blob is fetched from the store only when the cache lacks its hash: a process reads each version once. A
blob whose SHA-256 differs from its row, or a cache folder whose files differ from its manifest, is refused
(RegistryError) and never unpickled: serving processes keep the version they have instead. Serving processes
watch `pointer_stamp()` (one small query, at most every few seconds; never per request) to notice a promotion.

Versions an older sense7 wrote into `model_dir` itself (`v3/` with MANIFEST.json, `CURRENT`) are moved into the
store the first time a registry opens the home (`adopt_folder_versions`, run by `from_settings`).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any, Callable

from sense7.files import fsync_dir, sha256_of
from sense7.store.model_versions import ModelVersionRows, VersionExists, VersionRow

POINTER_NAME = "CURRENT"  # an older sense7's pointer file in model_dir (adopted, then removed)
MANIFEST_NAME = "MANIFEST.json"
METRICS_NAME = "metrics.json"
STAGING_PREFIX = ".staging-"
CACHE_FOLDER = "cache"
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_NUMBERED_RE = re.compile(r"^v(\d+)$")


class RegistryError(RuntimeError):
    """A version is missing, incomplete or corrupt, or a name is not a valid version name."""


@dataclass(frozen=True)
class ModelVersion:
    name: str
    path: Path  # where this process caches the version's files (present once it was loaded here)
    created_at: float
    metrics: dict = field(default_factory=dict)
    current: bool = False
    sha256: str = ""


def _default_loader(path: Path) -> Any:
    # Imported lazily: the registry is usable (listing, pruning, promoting) without the model stack.
    from sense7.model.bundle import load_bundle

    return load_bundle(path)


def _default_saver(bundle: Any, path: Path) -> None:
    from sense7.model.bundle import save_bundle

    save_bundle(bundle, path)


def check_version_name(name: str) -> str:
    """Version names become HTTP model_version strings and (in an older sense7) directory names: keep them plain."""
    if not isinstance(name, str) or not _VERSION_RE.match(name) or name == POINTER_NAME:
        raise RegistryError(
            f"invalid model version name {name!r}: use letters, digits, '.', '_' or '-' (at most 64, no '/')")
    return name


def pack_folder(path: Path) -> bytes:
    """A folder's files (the manifest left out) as one tar, the same bytes for the same files: names sorted,
    times, owners and modes fixed."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for file in sorted(p for p in path.rglob("*") if p.is_file() and p.name != MANIFEST_NAME):
            info = tarfile.TarInfo(file.relative_to(path).as_posix())
            info.size, info.mode, info.mtime = file.stat().st_size, 0o600, 0
            with open(file, "rb") as fh:
                tar.addfile(info, fh)
    return buffer.getvalue()


def unpack_blob(blob: bytes, dest: Path) -> None:
    """Unpack a version's tar into `dest`: regular files under it only (a blob is checked against its SHA-256
    first, but a store is no place to trust a path)."""
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        for member in tar.getmembers():
            name = Path(member.name)
            if not member.isfile() or name.is_absolute() or ".." in name.parts:
                raise RegistryError(f"model blob holds {member.name!r}, which is not a plain file")
            out = dest / name
            out.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(out, "wb") as fh:
                shutil.copyfileobj(src, fh)
            os.chmod(out, 0o600)


def write_manifest(path: Path, version: str) -> dict:
    """MANIFEST.json of a folder: size + SHA-256 of every other file; written last (fsync, rename)."""
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
    return manifest


def verify_folder(path: Path, version: str) -> dict:
    """A folder's manifest, or RegistryError when the manifest is missing or any file differs from it."""
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


def folder_versions(model_dir: Path) -> list[Path]:
    """An older sense7's version folders in `model_dir` (complete ones: with a manifest)."""
    if not model_dir.is_dir():
        return []
    return sorted(p for p in model_dir.iterdir() if p.is_dir() and _VERSION_RE.match(p.name)
                  and p.name != CACHE_FOLDER and (p / MANIFEST_NAME).is_file())


class ModelRegistry:
    """Versions of the served model in the store, the served-version pointer, and this process's cache.

    `store`: the study's `sense7.store.database.Store` (anything with an `engine`); `model_dir`: this process's
    cache folder. `loader(path) -> bundle` and `saver(bundle, path)` default to sense7.model.bundle's
    load_bundle/save_bundle; they are parameters so the registry does not care what a bundle is.
    """

    def __init__(self, model_dir: str | Path, store, loader: Callable[[Path], Any] | None = None,
                 saver: Callable[[Any, Path], None] | None = None):
        self.model_dir = Path(model_dir)
        self.store = store
        self.rows = ModelVersionRows(store.engine)
        self.loader = loader or _default_loader
        self.saver = saver or _default_saver

    @classmethod
    def from_settings(cls, settings, store=None) -> "ModelRegistry":
        """The registry of a process: the study's store (SENSE7_STORE_URL; `store` if the caller holds it open),
        this host's cache (SENSE7_MODEL_DIR); an older sense7's folder versions are moved into the store."""
        if store is None:
            from sense7.store.database import Store

            store = Store(settings.store_url)
        registry = cls(settings.model_dir, store)
        registry.adopt_folder_versions()
        return registry

    # ------------------------------------------------------------------ paths and names
    @property
    def cache_dir(self) -> Path:
        return self.model_dir / CACHE_FOLDER

    def path(self, version: str) -> Path:
        """Where this process caches `version`'s files (RegistryError when the store has no such version)."""
        return self.cache_dir / self._row(version).sha256

    def next_version(self) -> str:
        """'v<n+1>' after the highest numbered version present ('v1' for an empty registry)."""
        numbers = [int(m.group(1)) for row in self.rows.rows() if (m := _NUMBERED_RE.match(row.name))]
        return f"v{max(numbers, default=0) + 1}"

    def _row(self, version: str) -> VersionRow:
        row = self.rows.row(check_version_name(version))
        if row is None:
            raise RegistryError(f"model version {version!r} not found in the store")
        return row

    def _staging(self, label: str) -> Path:
        self.model_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{label}-", dir=self.model_dir))

    def _keep_in_cache(self, staging: Path, version: str, digest: str) -> Path:
        """Seal a filled staging folder and rename it to cache/<digest> (complete or absent)."""
        write_manifest(staging, version)
        for path in staging.rglob("*"):  # a model is data of the home: its owner's only, whatever the umask
            os.chmod(path, 0o700 if path.is_dir() else 0o600)
        fsync_dir(staging)
        final = self.cache_dir / digest
        self.cache_dir.mkdir(exist_ok=True, mode=0o700)
        try:
            os.rename(staging, final)
        except OSError:  # another thread or process cached the same blob first
            shutil.rmtree(staging, ignore_errors=True)
        fsync_dir(self.cache_dir)
        return final

    # ------------------------------------------------------------------ writing versions
    def add(self, bundle: Any, version: str | None = None, metrics: dict | None = None) -> ModelVersion:
        """Save `bundle` as a new version (not promoted): one row of the store, written in one transaction."""
        version = check_version_name(version or getattr(bundle, "version", None) or self.next_version())
        if self.rows.row(version) is not None:
            raise RegistryError(f"model version {version!r} already exists in the store")
        staging = self._staging(version)
        try:
            self.saver(bundle, staging)
            if metrics is None:
                metrics = getattr(bundle, "metrics", None) or {}
            metrics = json.loads(json.dumps(metrics, sort_keys=True, default=str))
            (staging / METRICS_NAME).write_text(json.dumps(metrics, indent=2, sort_keys=True))
            blob = pack_folder(staging)
            digest = sha256(blob).hexdigest()
            row = VersionRow(version, time.time(), metrics, digest, len(blob))
            try:
                self.rows.add(row, blob)
            except VersionExists:
                raise RegistryError(f"model version {version!r} already exists in the store") from None
            self._keep_in_cache(staging, version, digest)  # this process need not read it back
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return self._describe(row, self.current())

    # ------------------------------------------------------------------ reading versions
    def cached(self, version: str) -> Path:
        """The version's files in this process's cache, fetched from the store when the cache lacks its hash;
        RegistryError when the blob does not match its SHA-256 or the cached files their manifest."""
        row = self._row(version)
        folder = self.cache_dir / row.sha256
        if not folder.is_dir():
            blob = self.rows.bundle(version)
            if blob is None:
                raise RegistryError(f"model version {version!r} not found in the store")
            if len(blob) != row.size or sha256(blob).hexdigest() != row.sha256:
                raise RegistryError(f"model version {version!r} is corrupt: its blob in the store does not match "
                                    "its SHA-256")
            staging = self._staging(f"fetch-{version}")
            try:
                unpack_blob(blob, staging)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            folder = self._keep_in_cache(staging, version, row.sha256)
        verify_folder(folder, version)
        return folder

    def verify(self, version: str) -> dict:
        """The cached files' manifest (with the blob's sha256), or RegistryError if the version is corrupt."""
        folder = self.cached(version)
        manifest = json.loads((folder / MANIFEST_NAME).read_text())
        return {"version": version, "sha256": folder.name, "files": manifest["files"]}

    def load(self, version: str) -> Any:
        """Verify, then load. Raises RegistryError for a missing or corrupt version."""
        path = self.cached(version)
        try:
            return self.loader(path)
        except Exception as exc:
            raise RegistryError(f"model version {version!r} failed to load: {type(exc).__name__}: {exc}") from exc

    def metrics(self, version: str) -> dict:
        try:
            row = self.rows.row(check_version_name(version))
        except RegistryError:
            return {}
        return row.metrics if row else {}

    def _describe(self, row: VersionRow, current: str | None) -> ModelVersion:
        return ModelVersion(row.name, self.cache_dir / row.sha256, row.created_at, row.metrics, row.name == current,
                            row.sha256)

    def list_versions(self) -> list[ModelVersion]:
        """Every version in the store, oldest first."""
        current = self.current()
        return [self._describe(row, current) for row in self.rows.rows()]

    # ------------------------------------------------------------------ the serving pointer
    def current(self) -> str | None:
        pointer = self.rows.pointer()
        return pointer[0] if pointer else None

    def pointer_stamp(self) -> tuple[str, int] | None:
        """A fingerprint of the pointer (one small query): it changes whenever `promote` runs."""
        return self.rows.pointer()

    def promote(self, version: str) -> ModelVersion:
        """Point the store's pointer at `version` after verifying and test-loading it; serving processes follow."""
        self.load(version)
        self.rows.point_at(version)
        return self._describe(self._row(version), version)

    def remove(self, version: str) -> bool:
        """Delete one version (never the current one: RegistryError) and this process's copy. True when it was there."""
        check_version_name(version)
        if version == self.current():
            raise RegistryError(f"{version} is being served: promote another version first")
        row = self.rows.row(version)
        if row is None:
            return False
        self.rows.delete(version)
        self.prune_cache()
        return True

    def prune(self, keep: int = 3) -> list[str]:
        """Delete all but the newest `keep` versions (never the current one), stale staging folders (older than
        an hour: a trainer may still be writing a younger one) and cached versions no longer in the store."""
        if keep < 1:
            raise RegistryError("prune: keep must be at least 1")
        versions = self.list_versions()
        current = self.current()
        keep_names = {v.name for v in versions[-keep:]} | {current}
        removed = []
        for v in versions:
            if v.name not in keep_names:
                self.rows.delete(v.name)
                removed.append(v.name)
        if self.model_dir.is_dir():
            for p in self.model_dir.iterdir():
                if p.is_dir() and p.name.startswith(STAGING_PREFIX) and time.time() - p.stat().st_mtime > 3600:
                    shutil.rmtree(p, ignore_errors=True)
        self.prune_cache()
        return removed

    def prune_cache(self) -> list[str]:
        """Delete this process's cached copies of versions the store no longer holds (pruned, or erased with a
        withdrawn rater: no host keeps a copy of a removed version once its registry prunes)."""
        if not self.cache_dir.is_dir():
            return []
        wanted = {row.sha256 for row in self.rows.rows()}
        dropped = [p.name for p in self.cache_dir.iterdir() if p.name not in wanted]
        for name in dropped:
            shutil.rmtree(self.cache_dir / name, ignore_errors=True)
        return dropped

    # ------------------------------------------------------------------ an older sense7's folder
    def adopt_folder_versions(self) -> list[str]:
        """Move the versions an older sense7 kept in `model_dir` (`v3/` with MANIFEST.json, `CURRENT`) into the
        store: each verified against its manifest, added under its name unless the store has that name, the
        pointer set from `CURRENT` when the store has none. Adopted folders are removed; a corrupt one is left
        where it was (and never served). Returns the names added."""
        folders = folder_versions(self.model_dir)
        pointer_file = self.model_dir / POINTER_NAME
        if not folders and not pointer_file.exists():
            return []
        known = {row.name for row in self.rows.rows()}
        added = []
        for folder in folders:
            name = folder.name
            try:
                manifest = verify_folder(folder, name)
            except RegistryError:
                continue
            if name not in known:
                try:
                    metrics = json.loads((folder / METRICS_NAME).read_text())
                except (OSError, ValueError):
                    metrics = {}
                blob = pack_folder(folder)
                row = VersionRow(name, float(manifest.get("created_at") or folder.stat().st_mtime), metrics,
                                 sha256(blob).hexdigest(), len(blob))
                try:
                    self.rows.add(row, blob)
                    added.append(name)
                except VersionExists:  # another process adopted it meanwhile
                    pass
                known.add(name)
            shutil.rmtree(folder, ignore_errors=True)
        if pointer_file.exists():
            served = pointer_file.read_text().strip()
            if served in known and self.current() is None:
                self.rows.point_at(served)
            if served in known or not served:
                pointer_file.unlink(missing_ok=True)
        return added
