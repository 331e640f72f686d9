"""The registry in the store: versions added whole or not at all, the pointer, pruning, each process's cache
checked by SHA-256, and an older sense7's folder versions moved into the store."""

from __future__ import annotations

import json
import os
import stat

import pytest

from sqlalchemy import update

from sense7.model.registry import ModelRegistry, RegistryError, write_manifest
from sense7.store.database import Store
from sense7.store.tables import model_versions
from tests.support.fake_bundle import FakeBundle, load_fake, save_fake


def test_add_promote_current_list(registry):
    assert registry.current() is None and registry.list_versions() == [] and registry.next_version() == "v1"
    added = registry.add(FakeBundle("v1", metrics={"spearman": 0.41}))
    assert added.name == "v1" and not added.current and added.metrics == {"spearman": 0.41}
    assert registry.next_version() == "v2"
    registry.add(FakeBundle("v2"))
    registry.promote("v2")
    assert registry.current() == "v2"
    listed = registry.list_versions()
    assert [(v.name, v.current) for v in listed] == [("v1", False), ("v2", True)]
    assert registry.load("v2").version == "v2"
    assert not [p for p in registry.model_dir.iterdir() if p.name.startswith(".")]  # no leftovers
    cached = registry.path("v2")
    assert cached.parent == registry.cache_dir and cached.name == listed[1].sha256 and len(cached.name) == 64
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in cached.iterdir())  # the home's files: owner only


def test_version_names_cannot_escape_the_directory(registry):
    for bad in ("../evil", "a/b", ".hidden", "CURRENT", "x" * 65):
        with pytest.raises(RegistryError, match="invalid model version name"):
            registry.add(FakeBundle(bad))
    with pytest.raises(RegistryError):
        registry.promote("../v1")


def test_existing_version_is_not_overwritten(registry):
    registry.add(FakeBundle("v1", level=2))
    with pytest.raises(RegistryError, match="already exists"):
        registry.add(FakeBundle("v1", level=5))
    assert registry.load("v1").level == 2


def test_failed_save_leaves_nothing(registry):
    def broken_saver(bundle, path):
        (path / "half.bin").write_bytes(b"123")
        raise OSError("disk full")

    registry.saver = broken_saver
    with pytest.raises(OSError, match="disk full"):
        registry.add(FakeBundle("v1"))
    assert list(registry.model_dir.iterdir()) == [] and registry.list_versions() == []


def _corrupt_blob(registry, version):
    with registry.store.engine.begin() as conn:
        blob = conn.execute(model_versions.select().where(model_versions.c.name == version)).mappings().one()["bundle"]
        conn.execute(update(model_versions).where(model_versions.c.name == version).values(
            bundle=blob[:-10] + b"x" * 10))


def test_corrupt_versions_are_refused(registry, tmp_path):
    registry.add(FakeBundle("v1"))
    registry.promote("v1")
    registry.add(FakeBundle("v2"))
    # the cached copy altered after it was written
    pkl = registry.path("v2") / "bundle.pkl"
    pkl.write_bytes(pkl.read_bytes()[:-10])
    with pytest.raises(RegistryError, match="corrupt"):
        registry.promote("v2")
    # the blob in the store altered: another host (an empty cache) refuses it before unpacking anything
    _corrupt_blob(registry, "v2")
    other = ModelRegistry(tmp_path / "other-host", registry.store, loader=load_fake, saver=save_fake)
    with pytest.raises(RegistryError, match="does not match its SHA-256"):
        other.promote("v2")
    assert not (other.cache_dir.exists() and list(other.cache_dir.iterdir()))
    with pytest.raises(RegistryError, match="not found"):
        registry.promote("v3")
    assert registry.current() == "v1"
    assert [v.name for v in registry.list_versions()] == ["v1", "v2"]


def test_a_process_reads_each_blob_once(registry, tmp_path):
    """Another host's registry fetches a version from the store once; later loads come from its cache."""
    registry.add(FakeBundle("v1", level=4))
    registry.promote("v1")
    other = ModelRegistry(tmp_path / "other-host", registry.store, loader=load_fake, saver=save_fake)
    fetched = []
    real = other.rows.bundle
    other.rows.bundle = lambda name: fetched.append(name) or real(name)
    assert other.load("v1").level == 4 and other.load("v1").level == 4
    assert fetched == ["v1"]


def test_pointer_stamp_moves_with_every_promotion(registry):
    registry.add(FakeBundle("v1"))
    registry.add(FakeBundle("v2"))
    registry.promote("v1")
    before = registry.pointer_stamp()
    registry.promote("v2")
    assert registry.pointer_stamp() != before and registry.current() == "v2"
    again = registry.pointer_stamp()
    registry.promote("v2")  # the same version promoted again is still a promotion
    assert registry.pointer_stamp() != again


def test_prune_keeps_newest_and_current(registry, tmp_path):
    for i in range(1, 6):
        registry.add(FakeBundle(f"v{i}", level=i))
    registry.promote("v1")
    stale = registry.model_dir / ".staging-v9-old"
    stale.mkdir()
    os.utime(stale, (0, 0))
    fresh = registry.model_dir / ".staging-v10-now"
    fresh.mkdir()
    other = ModelRegistry(tmp_path / "other-host", registry.store, loader=load_fake, saver=save_fake)
    other.load("v2")
    assert registry.prune(keep=2) == ["v2", "v3"]
    assert [v.name for v in registry.list_versions()] == ["v1", "v4", "v5"]
    assert not stale.exists() and fresh.exists()
    assert len(list(registry.cache_dir.iterdir())) == 3  # the pruned versions' copies are gone here
    assert other.prune_cache() and not list(other.cache_dir.iterdir())  # and on another host at its next prune
    with pytest.raises(RegistryError):
        registry.prune(keep=0)


def test_metrics_are_kept_with_the_version(registry):
    registry.add(FakeBundle("v1"), metrics={"accuracy": 0.5})
    assert registry.metrics("v1") == {"accuracy": 0.5}
    assert json.loads((registry.path("v1") / "metrics.json").read_text()) == {"accuracy": 0.5}
    manifest = json.loads((registry.path("v1") / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == {"bundle.pkl", "metrics.json"}


def test_two_registries_on_one_store_agree(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    a = ModelRegistry(tmp_path / "host-a", store, loader=load_fake, saver=save_fake)
    b = ModelRegistry(tmp_path / "host-b", Store(store.url), loader=load_fake, saver=save_fake)
    a.add(FakeBundle("v1", level=5))
    b.promote("v1")
    assert a.current() == "v1" and b.load("v1").level == 5
    with pytest.raises(RegistryError, match="already exists"):
        b.add(FakeBundle("v1"))


def test_an_older_sense7s_folder_versions_move_into_the_store(tmp_path):
    """A home of the folder registry (v1/, v2/ with MANIFEST.json, CURRENT): opened once, its versions are in
    the store (the served one still served) and the folders are gone; a corrupt one is left and not served."""
    models = tmp_path / "models"
    for name, level in (("v1", 2), ("v2", 4), ("v3", 5)):
        save_fake(FakeBundle(name, level=level), models / name)
        (models / name / "metrics.json").write_text(json.dumps({"n": level}))
        write_manifest(models / name, name)
    (models / "v3" / "bundle.pkl").write_bytes(b"spoiled")
    (models / "CURRENT").write_text("v2\n")
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    registry = ModelRegistry(models, store, loader=load_fake, saver=save_fake)
    assert registry.adopt_folder_versions() == ["v1", "v2"]
    assert registry.current() == "v2" and registry.load("v2").level == 4 and registry.metrics("v1") == {"n": 2}
    assert not (models / "v1").exists() and not (models / "CURRENT").exists() and (models / "v3").exists()
    assert registry.adopt_folder_versions() == []


def test_a_strangers_blob_cannot_write_outside_the_cache(registry, tmp_path):
    """Someone who can write the store plants a version whose tar holds a path out of the cache (its SHA-256
    and size made to match): it is refused before anything is written, and never loaded."""
    import io
    import tarfile
    from hashlib import sha256

    from sense7.store.model_versions import VersionRow

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("bundle.pkl", "../../planted.txt"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"bad"))
    blob = buffer.getvalue()
    registry.rows.add(VersionRow("v6", 0.0, {}, sha256(blob).hexdigest(), len(blob)), blob)
    with pytest.raises(RegistryError, match="not a plain file"):
        registry.promote("v6")
    assert not list(tmp_path.rglob("planted.txt")) and registry.current() is None
    assert not [p for p in registry.model_dir.iterdir() if p.name.startswith(".staging-")]  # nothing left behind
