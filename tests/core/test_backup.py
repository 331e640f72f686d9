"""`sense7 backup` and `sense7 restore` (issue 40 item 3) without servers: the archive's contents, mode and
manifest; a restore into a fresh home gives back the same store, models and secrets; and a stranger's archive
(tampered, partial, path traversal, links, a newer store) or an occupied home is refused with nothing written.
The study going on after a restore, with the real stack, is tests/jobs/test_backup_restore.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from sense7.backup import BackupError, Target, read_archive
from sense7.model.registry import ModelRegistry
from sense7.settings import Settings
from sense7.store.database import Store
from sense7.store.migrations import head_revision
from tests.support.postgres import throwaway_databases

SENSE7 = str(Path(sys.executable).parent / "sense7")

# Every test runs `sense7 backup` or `sense7 restore` in processes of their own (and pg_dump): slow.
pytestmark = pytest.mark.slow


def make_study(home: Path, env_extra: dict | None = None) -> Settings:
    """A home with a store (raters, a staff entry), two model versions (v2 served), Label Studio's SQLite file
    and its secrets (the ones every process makes, and a crowd study's)."""
    import sqlite3

    from sense7.crowd.participants import study_secret
    from sense7.model.bundle import train_bundle
    from sense7.synthetic import synth
    from sense7.taxonomy import load_taxonomy

    cfg = Settings.from_env({"SENSE7_HOME": str(home), **(env_extra or {})})
    store = Store(cfg.store_url)
    store.upsert_raters([{"rater_id": "r1", "email": "r1@example.org", "traits": {"tipi_1": 3}},
                         {"rater_id": "r2", "traits": {}}])
    store.log_staff("import", raters=2)
    study_secret(cfg, "pilot")
    tax = load_taxonomy()
    registry = ModelRegistry.from_settings(cfg)
    bundle = train_bundle(synth.generate(12, 4, seed=3, taxonomy=tax).rating_data(), "v1", tax)
    for version in ("v1", "v2"):
        registry.add(bundle, version)
    registry.promote("v2")
    (cfg.home / "label-studio").mkdir(mode=0o700)
    conn = sqlite3.connect(cfg.home / "label-studio" / "label_studio.sqlite3")
    conn.execute("CREATE TABLE authtoken_token (key TEXT, user_id INTEGER)")
    conn.execute("INSERT INTO authtoken_token VALUES (?, 1)", (cfg.ls_token,))
    conn.commit()
    conn.close()
    return cfg


def secret_values(home: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((home / "secrets").iterdir())}


def home_env(home: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENSE7_")}
    return {**env, "SENSE7_HOME": str(home), **extra}


def cli(home: Path, *args, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([SENSE7, *args], env=home_env(home, **extra), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """One study and its archive for the module (the tests read them, never change them)."""
    tmp_path = tmp_path_factory.mktemp("study")
    cfg = make_study(tmp_path / "home")
    archive = tmp_path / "study.tar.gz"
    done = cli(cfg.home, "backup", "--out", str(archive), "--json")
    assert done.returncode == 0, done.stderr
    return cfg, archive, json.loads(done.stdout), done


def test_the_archive_is_private_complete_and_checksummed(study, tmp_path):
    cfg, archive, summary, done = study
    assert archive.stat().st_mode & 0o777 == 0o600
    assert summary["model_versions"] == 2 and summary["current_model"] == "v2" and summary["store"] == "sqlite"
    assert summary["label_studio"] == "sqlite" and summary["secrets"] == len(secret_values(cfg.home)) >= 5
    assert summary["store_revision"] == head_revision()
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())
        assert all(m.isfile() and m.mode == 0o600 for m in tar.getmembers())
        for entry in manifest["files"]:
            body = tar.extractfile(entry["path"]).read()
            assert len(body) == entry["size"]
            import hashlib

            assert hashlib.sha256(body).hexdigest() == entry["sha256"]
    assert set(names) == {"manifest.json", *(e["path"] for e in manifest["files"])}
    assert {"store/store.sqlite", "label-studio/label_studio.sqlite3", "secrets/ls_token",
            "secrets/crowd_pilot"} <= set(names)
    assert not [n for n in names if n.startswith("models/")]  # the versions are rows of the archived store
    with tarfile.open(archive) as tar:
        copy = tmp_path / "archived-store.sqlite"
        copy.write_bytes(tar.extractfile("store/store.sqlite").read())
    import sqlite3

    conn = sqlite3.connect(copy)
    assert conn.execute("SELECT name FROM model_versions ORDER BY name").fetchall() == [("v1",), ("v2",)]
    assert conn.execute("SELECT version FROM model_pointer").fetchall() == [("v2",)]
    conn.close()
    assert manifest["sense7_version"] and manifest["created"] and manifest["store_revision"] == head_revision()
    # no secret is printed or logged: not in the command's output, not in the staff log
    entries = Store(cfg.store_url).staff_entries()
    assert entries[-1]["action"] == "backup" and entries[-1]["detail"]["secrets"] == summary["secrets"]
    for value in secret_values(cfg.home).values():
        assert value not in done.stdout + done.stderr and value not in json.dumps(entries, default=str)


def test_a_restore_into_a_fresh_home_gives_the_study_back(study, tmp_path):
    cfg, archive, summary, _ = study
    fresh = tmp_path / "fresh"
    done = cli(fresh, "restore", str(archive))
    assert done.returncode == 0, done.stderr
    assert "restored" in done.stdout
    restored = Target.from_env({"SENSE7_HOME": str(fresh)})
    source, target = Store(cfg.store_url), Store(restored.store_url)
    assert json.loads(target.snapshot())["raters"] == json.loads(source.snapshot())["raters"]
    assert target.rater_emails() == {"r1": "r1@example.org"}
    assert secret_values(fresh) == secret_values(cfg.home)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in (fresh / "secrets").iterdir())
    assert (fresh / "secrets").stat().st_mode & 0o777 == 0o700
    registry, original = ModelRegistry.from_settings(restored), ModelRegistry.from_settings(cfg)
    assert registry.current() == "v2" and [v.name for v in registry.list_versions()] == ["v1", "v2"]
    assert registry.verify("v2") == original.verify("v2")
    import sqlite3

    conn = sqlite3.connect(restored.label_studio_sqlite)
    assert conn.execute("SELECT key, user_id FROM authtoken_token").fetchall() == [(cfg.ls_token, 1)]
    conn.close()
    assert restored.label_studio_sqlite.stat().st_mode & 0o777 == 0o600
    [entry] = [e for e in target.staff_entries() if e["action"] == "restore"]
    assert entry["detail"]["files"] == summary["files"] and entry["detail"]["secrets"] == summary["secrets"]
    for value in secret_values(fresh).values():
        assert value not in done.stdout + done.stderr and value not in json.dumps(entry, default=str)


def test_a_home_holding_a_study_is_refused_without_force(study, tmp_path):
    cfg, archive, _, _ = study
    other = Settings.from_env({"SENSE7_HOME": str(tmp_path / "other")})
    Store(other.store_url).upsert_raters([{"rater_id": "someone-else", "traits": {}}])
    before = Store(other.store_url).snapshot(), secret_values(other.home)
    done = cli(other.home, "restore", str(archive))
    assert done.returncode == 1 and done.stderr.startswith("error: ") and "already holds a study" in done.stderr
    assert (Store(other.store_url).snapshot(), secret_values(other.home)) == before
    forced = cli(other.home, "restore", str(archive), "--force")
    assert forced.returncode == 0, forced.stderr
    assert secret_values(other.home) == secret_values(cfg.home) and ModelRegistry.from_settings(other).current() == "v2"
    assert "someone-else" not in Store(other.store_url).raters_frame().index


def _rewrite(archive: Path, out: Path, change) -> Path:
    """A copy of `archive` whose members pass through change(name, bytes) -> list of (TarInfo, bytes|None)."""
    with tarfile.open(archive) as src, tarfile.open(out, "w:gz") as dst:
        for member in src.getmembers():
            body = src.extractfile(member).read()
            for info, data in change(member, body):
                dst.addfile(info, io.BytesIO(data) if data is not None else None)
    return out


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _assert_refused(archive: Path, fresh: Path, message: str) -> None:
    done = cli(fresh, "restore", str(archive))
    assert done.returncode == 1, done.stdout
    assert done.stderr.startswith("error: ") and message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 or "refused" in done.stderr
    leftovers = [p for p in fresh.rglob("*")] if fresh.exists() else []
    assert leftovers == [], leftovers  # nothing written: no store, no secrets, no staging left behind


def test_a_tampered_archive_is_refused(study, tmp_path):
    _, archive, _, _ = study

    def tamper(member, body):
        if member.name == "secrets/ls_token":
            return [_file(member.name, b"0" * len(body))]  # same size, other bytes
        return [(member, body)]

    _assert_refused(_rewrite(archive, tmp_path / "tampered.tar.gz", tamper), tmp_path / "fresh",
                    "does not match its checksum")


def test_a_partial_archive_is_refused(study, tmp_path):
    _, archive, _, _ = study
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    _assert_refused(cut, tmp_path / "fresh1", "not a complete sense7 backup")
    dropped = _rewrite(archive, tmp_path / "dropped.tar.gz",
                       lambda m, b: [] if m.name == "secrets/ls_token" else [(m, b)])
    _assert_refused(dropped, tmp_path / "fresh2", "is partial: secrets/ls_token")
    added = _rewrite(archive, tmp_path / "added.tar.gz", lambda m, b: [(m, b)] + (
        [_file("secrets/planted", b"x")] if m.name == "manifest.json" else []))
    _assert_refused(added, tmp_path / "fresh3", "which the manifest does not list")


def test_an_older_archives_model_folders_are_restored_into_the_store(study, tmp_path):
    """An archive of the folder registry (models/<version>/ with MANIFEST.json, models/CURRENT): its versions
    are rows of the restored store, and no folder is left in the new home's model directory."""
    cfg, archive, _, _ = study
    [cached] = list((cfg.model_dir / "cache").iterdir())  # v1 and v2 are one bundle: one folder, with its manifest
    folder = {f"models/v9/{p.relative_to(cached).as_posix()}": p.read_bytes()
              for p in sorted(cached.rglob("*")) if p.is_file()}
    folder["models/CURRENT"] = b"v9\n"

    def add_folder(member, body):
        if member.name != "manifest.json":
            return [(member, body)]
        import hashlib

        manifest = json.loads(body)
        manifest["model_versions"] = [*manifest["model_versions"], "v9"]
        manifest["files"] += [{"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                              for name, data in folder.items()]
        return [_file("manifest.json", json.dumps(manifest).encode()),
                *(_file(name, data) for name, data in folder.items())]

    older = _rewrite(archive, tmp_path / "older.tar.gz", add_folder)
    fresh = tmp_path / "fresh"
    done = cli(fresh, "restore", str(older))
    assert done.returncode == 0, done.stderr
    restored = ModelRegistry.from_settings(Settings.from_env({"SENSE7_HOME": str(fresh)}))
    assert sorted(v.name for v in restored.list_versions()) == ["v1", "v2", "v9"]
    assert restored.current() == "v2"  # the store's pointer stands; the folder's CURRENT only fills an empty one
    assert restored.load("v9").controls
    assert sorted(p.name for p in restored.model_dir.iterdir()) == ["cache"]


def test_an_archive_unpacking_to_more_than_its_manifest_lists_writes_nothing(study, tmp_path):
    """A stranger's archive whose member is larger than the manifest says (64 MiB of zeros: 64 kB packed) is
    refused before a byte of it is written; one whose manifest lists more than the disk holds, before any file
    is written; and a given cap is kept."""
    _, archive, _, _ = study
    bomb = b"\0" * (64 << 20)
    swollen = _rewrite(archive, tmp_path / "swollen.tar.gz", lambda m, b: [
        _file(m.name, bomb) if m.name == "secrets/ls_token" else (m, b)])
    assert swollen.stat().st_size < 1 << 20
    _assert_refused(swollen, tmp_path / "fresh1", "secrets/ls_token is not the size its manifest lists")

    def claims_a_petabyte(member, body):
        if member.name != "manifest.json":
            return [(member, body)]
        manifest = json.loads(body)
        manifest["files"][0]["size"] = 10 ** 15
        return [_file(member.name, json.dumps(manifest).encode())]

    _assert_refused(_rewrite(archive, tmp_path / "huge.tar.gz", claims_a_petabyte), tmp_path / "fresh2",
                    "unpacks to 1,000,000,000,")
    capped = tmp_path / "capped"
    capped.mkdir()
    with pytest.raises(BackupError, match="are free for it"):
        read_archive(archive, capped, max_bytes=1000)
    assert list(capped.iterdir()) == []
    assert read_archive(archive, tmp_path / "roomy", max_bytes=10 ** 9)["format"] == "sense7-backup"


@pytest.mark.parametrize("name", ["../evil", "store/../../evil", "/tmp/evil", "secrets/./x", "elsewhere/x"])
def test_a_stranger_archive_with_a_path_outside_is_refused(study, tmp_path, name):
    _, archive, _, _ = study
    planted = _rewrite(archive, tmp_path / "planted.tar.gz", lambda m, b: [(m, b)] + (
        [_file(name, b"owned")] if m.name == "manifest.json" else []))
    _assert_refused(planted, tmp_path / "fresh", "refused")
    assert not (tmp_path / "evil").exists() and not Path("/tmp/evil").exists()


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE])
def test_a_stranger_archive_with_a_link_is_refused(study, tmp_path, kind):
    _, archive, _, _ = study

    def link(member, body):
        if member.name != "secrets/ls_token":
            return [(member, body)]
        info = tarfile.TarInfo(member.name)
        info.type, info.linkname = kind, "/etc/passwd" if kind == tarfile.SYMTYPE else "store/store.sqlite"
        return [(info, None)]

    _assert_refused(_rewrite(archive, tmp_path / "linked.tar.gz", link), tmp_path / "fresh", "a link")


def test_an_archive_of_a_newer_store_is_refused(study, tmp_path):
    _, archive, _, _ = study

    def newer(member, body):
        if member.name != "manifest.json":
            return [(member, body)]
        manifest = json.loads(body)
        manifest["store_revision"] = "9001"
        return [_file(member.name, json.dumps(manifest).encode())]

    done = cli(tmp_path / "fresh", "restore", str(_rewrite(archive, tmp_path / "newer.tar.gz", newer)))
    assert done.returncode == 1 and "revision 9001, newer than this sense7" in done.stderr
    assert not (tmp_path / "fresh" / "store.sqlite").exists() and not (tmp_path / "fresh" / "secrets").exists()


def test_backup_refuses_to_overwrite_and_an_unknown_archive(study, tmp_path):
    cfg, archive, _, _ = study
    before = archive.read_bytes()
    done = cli(cfg.home, "backup", "--out", str(archive))
    assert done.returncode == 1 and "already exists" in done.stderr and archive.read_bytes() == before
    not_ours = tmp_path / "other.tar.gz"
    with tarfile.open(not_ours, "w:gz") as tar:
        info, data = _file("store/store.sqlite", b"x")
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(BackupError, match="no sense7 backup manifest"):
        read_archive(not_ours, tmp_path)


# -- PostgreSQL: pg_dump and pg_restore ---------------------------------------------------------------------
@pytest.fixture
def pg_databases():
    with throwaway_databases("sense7_backup", 2) as urls:
        yield urls


def test_a_postgresql_store_is_dumped_and_restored(pg_databases, tmp_path):
    source_url, target_url = pg_databases
    cfg = make_study(tmp_path / "home", {"SENSE7_STORE_URL": source_url})
    archive = tmp_path / "pg.tar.gz"
    done = cli(cfg.home, "backup", "--out", str(archive), "--json", SENSE7_STORE_URL=source_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["store"] == "postgresql"
    with tarfile.open(archive) as tar:
        assert "store/store.pgdump" in tar.getnames()
    restored = cli(tmp_path / "fresh", "restore", str(archive), SENSE7_STORE_URL=target_url)
    assert restored.returncode == 0, restored.stderr
    source, target = Store(source_url), Store(target_url)
    assert json.loads(target.snapshot())["raters"] == json.loads(source.snapshot())["raters"]
    assert [e["action"] for e in target.staff_entries()][-2:] == ["backup", "restore"] or \
        [e["action"] for e in target.staff_entries()][-1] == "restore"
    again = cli(tmp_path / "fresh2", "restore", str(archive), SENSE7_STORE_URL=target_url)
    assert again.returncode == 1 and "already holds a study (a store)" in again.stderr
    source.engine.dispose()
    target.engine.dispose()


def test_label_studios_postgresql_database_is_dumped_and_restored(tmp_path):
    """Label Studio on PostgreSQL (SENSE7_LS_DATABASE_URL, as the deployment guide recommends): its database is
    dumped into the archive and restored into the target's; a target whose database has tables is refused
    without --force (nothing changed), and replaced with it."""
    import sqlalchemy

    with throwaway_databases("sense7_backup_ls", 2) as (source_url, target_url):
        plain = [url.replace("postgresql+psycopg2://", "postgresql://", 1) for url in (source_url, target_url)]
        cfg = make_study(tmp_path / "home", {"SENSE7_LS_DATABASE_URL": plain[0]})
        source = sqlalchemy.create_engine(source_url)
        with source.begin() as conn:
            conn.execute(sqlalchemy.text("CREATE TABLE authtoken_token (key TEXT, user_id INTEGER)"))
            conn.execute(sqlalchemy.text("INSERT INTO authtoken_token VALUES (:k, 1), ('other', 2)"), {"k": cfg.ls_token})
        archive = tmp_path / "ls-pg.tar.gz"
        done = cli(cfg.home, "backup", "--out", str(archive), "--json", SENSE7_LS_DATABASE_URL=plain[0])
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["label_studio"] == "postgresql"
        with tarfile.open(archive) as tar:
            assert "label-studio/label_studio.pgdump" in tar.getnames()
            assert "label-studio/label_studio.sqlite3" not in tar.getnames()  # the SQLite file beside it is not LS's

        target = sqlalchemy.create_engine(target_url)
        with target.begin() as conn:
            conn.execute(sqlalchemy.text("CREATE TABLE leftover (x INTEGER)"))
        refused = cli(tmp_path / "fresh", "restore", str(archive), SENSE7_LS_DATABASE_URL=plain[1])
        assert refused.returncode == 1 and "Label Studio's database" in refused.stderr
        assert sqlalchemy.inspect(target).get_table_names() == ["leftover"]
        assert not (tmp_path / "fresh" / "store.sqlite").exists()

        restored = cli(tmp_path / "fresh", "restore", str(archive), "--force", SENSE7_LS_DATABASE_URL=plain[1])
        assert restored.returncode == 0, restored.stderr
        with target.connect() as conn:
            rows = conn.execute(sqlalchemy.text("SELECT key, user_id FROM authtoken_token ORDER BY user_id")).all()
        assert [tuple(r) for r in rows] == [(cfg.ls_token, 1), ("other", 2)]
        assert secret_values(tmp_path / "fresh")["ls_token"] == cfg.ls_token
        source.dispose()
        target.dispose()
