"""A study's state in one archive, and back (`sense7 backup`, `sense7 restore`).

A study is four things: sense7's store (SQLite copied through SQLite's backup API, so a running stack may keep
writing; PostgreSQL through `pg_dump`; it holds the model registry: every version and the served pointer),
Label Studio's database (its SQLite file under the home, or `pg_dump` of SENSE7_LS_DATABASE_URL) and the home's
secrets (`SENSE7_HOME/secrets/`: Label Studio's token and admin password, the webhook and backend secrets, the
rater page's session key, each crowd study's id key). One tar.gz, written 0600, holds them with `manifest.json`:
every file's path, size and SHA-256, the store's schema revision, when, by which sense7.

A restore reads the whole archive before it writes anything: only regular files under the four known folders
(no link, device, absolute path or `..`), exactly the files the manifest lists with their sizes and checksums
(the manifest comes first and bounds what is unpacked), a store revision this sense7 knows. Then it refuses a target that already holds a study (a store with tables,
models, Label Studio's database, secrets) unless forced, and moves everything into place. Secrets are never
printed or logged: the staff log gets counts.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import make_url

from sense7 import __version__
from sense7.files import sha256_of
from sense7.labelstudio.label_studio_process import LabelStudioServer
from sense7.model.registry import (MANIFEST_NAME, POINTER_NAME, ModelRegistry, RegistryError, check_version_name,
                                   folder_versions, verify_folder)
from sense7.settings import Settings, secure_home
from sense7.store.database import Store, log_staff_entry
from sense7.store.model_versions import ModelVersionRows

FORMAT = "sense7-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SECRETS_DIR = "secrets"
STORE_SQLITE, STORE_DUMP = "store/store.sqlite", "store/store.pgdump"
LS_SQLITE, LS_DUMP = "label-studio/label_studio.sqlite3", "label-studio/label_studio.pgdump"
TOP_FOLDERS = ("store", "models", "label-studio", SECRETS_DIR)
MAX_MEMBERS = 100_000
UNPACK_RESERVE = 512 * 1024 * 1024  # (bytes) a restore leaves this much of its disk free


class BackupError(RuntimeError):
    """A backup that cannot be made, or an archive that is refused (tampered, partial, unsafe, too new)."""


@dataclass(frozen=True)
class Target:
    """Where a study lives (or will): the parts of `Settings` a backup or restore needs, read without creating
    anything (Settings.from_env would generate secrets in a fresh home)."""
    home: Path
    store_url: str
    model_dir: Path
    ls_database_url: str | None

    @classmethod
    def from_settings(cls, cfg: Settings) -> Target:
        return cls(cfg.home, cfg.store_url, cfg.model_dir, cfg.ls_database_url)

    @classmethod
    def from_env(cls, env: dict | None = None) -> Target:
        env = os.environ if env is None else env
        home = Path(env.get("SENSE7_HOME", Path.cwd() / ".sense7")).resolve()
        return cls(home, env.get("SENSE7_STORE_URL", f"sqlite:///{home / 'store.sqlite'}"),
                   Path(env.get("SENSE7_MODEL_DIR", home / "models")).resolve(),
                   env.get("SENSE7_LS_DATABASE_URL") or None)

    @property
    def label_studio_sqlite(self) -> Path:
        return LabelStudioServer.sqlite_file(self.home)

    @property
    def secrets_dir(self) -> Path:
        return self.home / SECRETS_DIR


# -- helpers -------------------------------------------------------------------------------------------------
def _sqlite_path(url: str) -> Path | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    if not parsed.database or parsed.database == ":memory:":
        raise BackupError(f"the store {url} is an in-memory database: nothing to back up or restore into")
    return Path(parsed.database).resolve()


def _pg_environment(url: str) -> dict[str, str]:
    """libpq's variables for `url` (the password goes through the environment, never the command line)."""
    parsed = make_url(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(PGHOST=parsed.host or "127.0.0.1", PGPORT=str(parsed.port or 5432),
               PGUSER=unquote(parsed.username or "postgres"), PGDATABASE=parsed.database or "")
    if parsed.password:
        env["PGPASSWORD"] = str(parsed.password)
    return env


def _run_pg(tool: str, args: list[str], url: str, what: str) -> None:
    if shutil.which(tool) is None:
        raise BackupError(f"{tool} is not installed: {what} needs it (Debian: postgresql-client)")
    done = subprocess.run([tool, *args], env=_pg_environment(url), capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise BackupError(f"{what}: {tool} failed: {reason}")


def _copy_sqlite(source: Path, dest: Path) -> None:
    """A consistent copy of a live SQLite database (the backup API; WAL contents included)."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(dest)
    try:
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=DELETE")
    finally:
        dst.close()
        src.close()


def _private_file(path: Path):
    """A new file readable by this user only (0600), whatever the umask."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")


# -- backup --------------------------------------------------------------------------------------------------
def _gather(target: Target, staging: Path) -> dict:
    """Copy the study's parts into `staging` (its archive layout); what was found."""
    from sense7.store.migrations import check_known, current_revision

    found = {"store": None, "label_studio": None, "model_versions": [], "current_model": None, "secrets": 0,
             "store_revision": None}
    store_file = _sqlite_path(target.store_url)
    engine = create_engine(target.store_url)
    try:
        found["store_revision"] = current_revision(engine)
        check_known(found["store_revision"], engine)
        rows = ModelVersionRows(engine)
        if rows.present():  # listed before the copy below: every version listed is in the archive
            found["model_versions"] = [row.name for row in rows.rows()]
            pointer = rows.pointer()
            found["current_model"] = pointer[0] if pointer else None
    finally:
        engine.dispose()
    (staging / "store").mkdir()
    if store_file is not None:
        if not store_file.is_file():
            raise BackupError(f"no store at {store_file}: nothing to back up")
        _copy_sqlite(store_file, staging / STORE_SQLITE)
        found["store"] = "sqlite"
    else:
        _run_pg("pg_dump", ["--format=custom", "--no-owner", "--no-privileges", "--file",
                            str(staging / STORE_DUMP)], target.store_url, "backing up the store")
        found["store"] = "postgresql"

    # Model versions live in the store (sense7.model.registry), so its copy above carries them. Folder versions of
    # an older sense7 that no registry has moved into the store yet are carried as they were.
    for folder in folder_versions(target.model_dir):
        try:
            manifest = verify_folder(folder, folder.name)
        except RegistryError:
            continue  # a corrupt version is never served: not worth keeping either
        out = staging / "models" / folder.name
        out.mkdir(parents=True)
        for rel in [*manifest["files"], MANIFEST_NAME]:
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(folder / rel, out / rel)
        found["model_versions"].append(folder.name)
    pointer_file = target.model_dir / POINTER_NAME
    if found["current_model"] is None and pointer_file.is_file():
        current = pointer_file.read_text().strip()
        if current in found["model_versions"]:
            (staging / "models" / POINTER_NAME).write_text(current + "\n")
            found["current_model"] = current

    (staging / "label-studio").mkdir()
    if target.ls_database_url:
        _run_pg("pg_dump", ["--format=custom", "--no-owner", "--no-privileges", "--file", str(staging / LS_DUMP)],
                target.ls_database_url, "backing up Label Studio's database")
        found["label_studio"] = "postgresql"
    elif target.label_studio_sqlite.is_file():
        _copy_sqlite(target.label_studio_sqlite, staging / LS_SQLITE)
        found["label_studio"] = "sqlite"

    (staging / SECRETS_DIR).mkdir()
    if target.secrets_dir.is_dir():
        for secret in sorted(target.secrets_dir.iterdir()):
            if secret.is_file() and not secret.is_symlink():
                shutil.copyfile(secret, staging / SECRETS_DIR / secret.name)
                found["secrets"] += 1
    return found


def backup(target: Target, out: Path, overwrite: bool = False) -> dict:
    """Write the study of `target` to `out` (tar.gz, 0600, atomically); the manifest's summary (no secrets)."""
    out = Path(out).resolve()
    if out.exists() and not overwrite:
        raise BackupError(f"{out} already exists (give --force to replace it)")
    if not out.parent.is_dir():
        raise BackupError(f"{out.parent}: no such folder")
    with tempfile.TemporaryDirectory(prefix=".sense7-backup-", dir=out.parent) as tmp:
        staging = Path(tmp) / "study"
        staging.mkdir(mode=0o700)
        found = _gather(target, staging)
        files = sorted(p for p in staging.rglob("*") if p.is_file())
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "sense7_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "store_revision": found["store_revision"], "store": found["store"],
            "label_studio": found["label_studio"], "model_versions": found["model_versions"],
            "current_model": found["current_model"],
            "files": [{"path": p.relative_to(staging).as_posix(), "size": p.stat().st_size, "sha256": sha256_of(p)}
                      for p in files]}
        partial = Path(tmp) / "archive.tar.gz"
        with _private_file(partial) as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            body = json.dumps(manifest, indent=1).encode()
            tar.addfile(_member(MANIFEST, len(body)), io.BytesIO(body))
            for path, entry in zip(files, manifest["files"]):
                with open(path, "rb") as fh:
                    tar.addfile(_member(entry["path"], entry["size"]), fh)
        os.replace(partial, out)
    summary = _summary(manifest, found["secrets"])
    engine = create_engine(target.store_url)
    try:
        log_staff_entry(engine, "backup", **{k: v for k, v in summary.items() if k != "created"})
    finally:
        engine.dispose()
    return summary


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o600, int(datetime.now(timezone.utc).timestamp())
    return info


def _summary(manifest: dict, secrets: int) -> dict:
    """What the command prints and the staff log keeps: counts and names of parts, never a secret."""
    return {"files": len(manifest["files"]), "bytes": sum(f["size"] for f in manifest["files"]),
            "store": manifest["store"], "store_revision": manifest["store_revision"],
            "label_studio": manifest["label_studio"], "model_versions": len(manifest["model_versions"]),
            "current_model": manifest["current_model"], "secrets": secrets, "created": manifest["created"],
            "sense7_version": manifest["sense7_version"]}


# -- reading an archive --------------------------------------------------------------------------------------
def _safe_name(name: str) -> str:
    """The member's path if it is a plain relative path under a known folder (or the manifest); else refused."""
    path = PurePosixPath(name)
    if (not name or name.startswith("/") or "\\" in name or "\x00" in name or path.is_absolute()
            or any(part in ("..", ".", "") for part in name.split("/"))):
        raise BackupError(f"the archive holds an unsafe path {name!r}: refused, nothing restored")
    if name != MANIFEST and path.parts[0] not in TOP_FOLDERS:
        raise BackupError(f"the archive holds {name!r}, outside what a sense7 backup holds: refused, nothing restored")
    return name


def read_archive(archive: Path, into: Path, max_bytes: int | None = None) -> dict:
    """Extract `archive` into the empty folder `into` after checking every member, then check the files
    against the manifest. The manifest; BackupError (nothing left in `into` worth using) otherwise.

    The manifest comes first (`backup` writes it so) and bounds what is written: its files must fit in
    `max_bytes` (default: the free space of `into`'s disk less UNPACK_RESERVE), and a member it does not list,
    or of another size than it lists, is refused before a byte of it is written: an archive that would
    unpack to more than it says (a "zip bomb") fills nothing."""
    archive = Path(archive)
    if not archive.is_file():
        raise BackupError(f"{archive}: no such file")
    manifest, listed = None, {}
    written: dict[str, tuple[int, str]] = {}
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for count, member in enumerate(tar):
                if count >= MAX_MEMBERS:
                    raise BackupError(f"{archive}: more than {MAX_MEMBERS} members: refused, nothing restored")
                name = _safe_name(member.name)
                if member.isdir():
                    continue
                if not member.isfile():
                    kind = "a link" if member.issym() or member.islnk() else "a special file"
                    raise BackupError(f"the archive holds {kind} at {name!r}: refused, nothing restored")
                if manifest is None:
                    if name != MANIFEST:
                        raise BackupError(f"{archive} has no sense7 backup manifest first: refused, nothing restored")
                    try:
                        manifest = json.loads(tar.extractfile(member).read(10_000_000))
                    except ValueError as exc:
                        raise BackupError(f"{archive}: manifest.json is not JSON ({exc}): refused") from None
                    listed = manifest_listing(archive, manifest)
                    check_room(archive, sum(size for size, _ in listed.values()), into, max_bytes)
                    continue
                if name in written or name == MANIFEST:
                    raise BackupError(f"the archive holds {name!r} twice: refused, nothing restored")
                if name not in listed:
                    raise BackupError(f"{archive} holds {name}, which the manifest does not list: refused, "
                                      "nothing restored")
                if member.size != listed[name][0]:
                    raise BackupError(f"{archive}: {name} is not the size its manifest lists (tampered or damaged): "
                                      "refused, nothing restored")
                source = tar.extractfile(member)
                dest = into / name
                dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                digest, size = hashlib.sha256(), 0
                with _private_file(dest) as fh:
                    for block in iter(lambda: source.read(1 << 20), b""):
                        digest.update(block)
                        size += len(block)
                        fh.write(block)
                written[name] = (size, digest.hexdigest())
    except (tarfile.TarError, EOFError, OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, OSError) and exc.filename is not None:
            raise
        raise BackupError(f"{archive} is not a complete sense7 backup ({type(exc).__name__}: {exc}): "
                          "refused, nothing restored") from None
    if manifest is None:
        raise BackupError(f"{archive} has no sense7 backup manifest: refused, nothing restored")
    check_files(archive, manifest, listed, written)
    return manifest


def manifest_listing(archive: Path, manifest) -> dict[str, tuple[int, str]]:
    """path -> (size, SHA-256) of every file the manifest lists; BackupError for a manifest that is not one."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupError(f"{archive} has no sense7 backup manifest: refused, nothing restored")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BackupError(f"{archive}: backup format {manifest.get('format_version')!r}, this sense7 reads "
                          f"{FORMAT_VERSION}: refused, nothing restored")
    listed = {}
    for entry in manifest.get("files") or []:
        try:
            name, size, digest = _safe_name(entry["path"]), int(entry["size"]), str(entry["sha256"])
        except (KeyError, TypeError, ValueError, AttributeError):
            size = -1
        if size < 0:
            raise BackupError(f"{archive}: a manifest entry is malformed: refused, nothing restored")
        listed[name] = (size, digest)
    return listed


def check_room(archive: Path, total: int, into: Path, max_bytes: int | None) -> None:
    """Refuse an archive whose files would not fit: in `max_bytes`, else in the free space of `into`'s disk
    less UNPACK_RESERVE (a restore must not fill the disk the running study's store lives on)."""
    room = max_bytes if max_bytes is not None else shutil.disk_usage(into).free - UNPACK_RESERVE
    if total > room:
        raise BackupError(f"{archive} unpacks to {total:,} bytes; {max(room, 0):,} are free for it: refused, "
                          "nothing restored")


def check_files(archive: Path, manifest: dict, listed: dict[str, tuple[int, str]],
                written: dict[str, tuple[int, str]]) -> None:
    missing = sorted(set(listed) - set(written))
    if missing:
        raise BackupError(f"{archive} is partial: {missing[0]} (and {len(missing) - 1} more) listed in the manifest "
                          "is missing: refused, nothing restored")
    for name, (size, digest) in sorted(written.items()):
        if (size, digest) != listed[name]:
            raise BackupError(f"{archive}: {name} does not match its checksum in the manifest (tampered or "
                              "damaged): refused, nothing restored")
    store = STORE_SQLITE if manifest.get("store") == "sqlite" else STORE_DUMP
    if store not in written:
        raise BackupError(f"{archive} holds no store: refused, nothing restored")


# -- restore -------------------------------------------------------------------------------------------------
def occupied(target: Target) -> list[str]:
    """What of a study the target already holds (empty: a fresh home)."""
    held = []
    store_file = _sqlite_path(target.store_url)
    if store_file is None or store_file.exists():
        engine = create_engine(target.store_url)
        try:
            if inspect(engine).get_table_names():
                held.append("a store")
        finally:
            engine.dispose()
    if folder_versions(target.model_dir) or (target.model_dir / POINTER_NAME).exists():
        held.append("model versions")  # an older sense7's, not yet in its store (the store's are in "a store")
    if target.ls_database_url:
        engine = create_engine(target.ls_database_url.replace("postgresql://", "postgresql+psycopg2://", 1))
        try:
            if inspect(engine).get_table_names():
                held.append("Label Studio's database")
        finally:
            engine.dispose()
    elif target.label_studio_sqlite.exists():
        held.append("Label Studio's database")
    if target.secrets_dir.is_dir() and any(target.secrets_dir.iterdir()):
        held.append("secrets")
    return held


def _install_sqlite(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for stale in (dest.with_name(dest.name + "-wal"), dest.with_name(dest.name + "-shm")):
        stale.unlink(missing_ok=True)
    os.chmod(source, 0o600)
    shutil.move(source, dest)  # a rename when both are on one file system


def _restore_pg(dump: Path, url: str, force: bool, what: str) -> None:
    args = ["--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction", "--dbname",
            make_url(url).database or ""]
    if force:
        args = ["--clean", "--if-exists", *args]
    _run_pg("pg_restore", [*args, str(dump)], url, what)


def restore(archive: Path, target: Target, force: bool = False) -> dict:
    """Bring the study of `archive` into `target`. Everything is checked before anything is written."""
    from sense7.store.migrations import StoreTooNewError, known_revisions

    secure_home(target.home)
    with tempfile.TemporaryDirectory(prefix=".restore-", dir=target.home) as tmp:
        staging = Path(tmp)
        manifest = read_archive(archive, staging)
        revision = manifest.get("store_revision")
        if revision is not None and revision not in known_revisions():
            raise StoreTooNewError(f"{archive}: its store is at revision {revision}, newer than this sense7 "
                                   f"{__version__} knows: restore it with that sense7 or a newer one")
        store_file = _sqlite_path(target.store_url)
        if (manifest["store"] == "sqlite") != (store_file is not None):
            raise BackupError(f"{archive} holds a {manifest['store']} store; the target's store ({target.store_url}) "
                              "is not: refused, nothing restored")
        if manifest.get("label_studio") and (manifest["label_studio"] == "postgresql") != bool(target.ls_database_url):
            raise BackupError(f"{archive} holds Label Studio's database on {manifest['label_studio']}; the target's "
                              "is not (SENSE7_LS_DATABASE_URL): refused, nothing restored")
        held = occupied(target)
        if held and not force:
            raise BackupError(f"{target.home} already holds a study ({', '.join(held)}): restore into a fresh home, "
                              "or give --force to replace it")

        if store_file is not None:
            _install_sqlite(staging / STORE_SQLITE, store_file)
        else:
            _restore_pg(staging / STORE_DUMP, target.store_url, force, "restoring the store")
        if manifest.get("label_studio") == "sqlite":
            _install_sqlite(staging / LS_SQLITE, target.label_studio_sqlite)
        elif manifest.get("label_studio") == "postgresql":
            _restore_pg(staging / LS_DUMP, target.ls_database_url, force, "restoring Label Studio's database")
        models = staging / "models"  # an older sense7's archive: version folders, moved into the store below
        if models.is_dir():
            target.model_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            for folder in sorted(p for p in models.iterdir() if p.is_dir()):
                dest = target.model_dir / check_version_name(folder.name)
                if dest.exists():
                    shutil.rmtree(dest)
                shutil.move(folder, dest)
            pointer = models / POINTER_NAME
            if pointer.is_file():
                shutil.move(pointer, target.model_dir / POINTER_NAME)
        secrets = sorted((staging / SECRETS_DIR).iterdir()) if (staging / SECRETS_DIR).is_dir() else []
        if secrets:
            target.secrets_dir.mkdir(exist_ok=True, mode=0o700)
            os.chmod(target.secrets_dir, 0o700)
            for secret in secrets:
                os.chmod(secret, 0o600)
                os.replace(secret, target.secrets_dir / secret.name)  # staging is inside the home
    summary = _summary(manifest, len(secrets))
    store = Store(target.store_url)  # brings an older archive's store to this sense7's revision
    ModelRegistry(target.model_dir, store).adopt_folder_versions()  # an older archive's models/ into the store
    store.log_staff("restore", **{k: v for k, v in summary.items() if k != "created"},
                    archive_created=manifest["created"])
    store.engine.dispose()
    return summary
