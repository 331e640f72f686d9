"""The on-disk registry: complete-or-absent versions, the atomic pointer, pruning."""

from __future__ import annotations

import json
import os
import stat

import pytest

from sense7.model.registry import ModelRegistry, RegistryError
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
    assert stat.S_IMODE(registry.pointer_path.stat().st_mode) == 0o600  # a data file of the home: owner only


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
    assert list(registry.model_dir.iterdir()) == []


def test_corrupt_or_incomplete_versions_are_refused(registry):
    registry.add(FakeBundle("v1"))
    registry.promote("v1")
    registry.add(FakeBundle("v2"))
    pkl = registry.path("v2") / "bundle.pkl"
    pkl.write_bytes(pkl.read_bytes()[:-10])  # truncated after sealing
    with pytest.raises(RegistryError, match="corrupt"):
        registry.promote("v2")
    # a directory somebody is still filling (no manifest yet)
    save_fake(FakeBundle("v3"), registry.model_dir / "v3")
    with pytest.raises(RegistryError, match="incomplete"):
        registry.promote("v3")
    assert registry.current() == "v1"
    assert [v.name for v in registry.list_versions()] == ["v1", "v2"]


def test_seal_a_directory_written_in_place(registry):
    save_fake(FakeBundle("v7"), registry.model_dir / "v7")
    registry.seal("v7")
    registry.promote("v7")
    assert registry.current() == "v7"
    (registry.model_dir / "v8").mkdir()
    (registry.model_dir / "v8" / "bundle.pkl").write_bytes(b"garbage")
    with pytest.raises(Exception):
        registry.seal("v8")  # cannot be loaded, so it is not sealed
    assert not (registry.model_dir / "v8" / "MANIFEST.json").exists()


def test_pointer_is_replaced_atomically(registry):
    registry.add(FakeBundle("v1"))
    registry.add(FakeBundle("v2"))
    registry.promote("v1")
    before = registry.pointer_stamp()
    inode = os.stat(registry.pointer_path).st_ino
    registry.promote("v2")
    assert registry.pointer_stamp() != before
    assert os.stat(registry.pointer_path).st_ino != inode  # a new file renamed over the old, not rewritten
    assert registry.pointer_path.read_text() == "v2\n"


def test_prune_keeps_newest_and_current(registry):
    for i in range(1, 6):
        registry.add(FakeBundle(f"v{i}"))
    registry.promote("v1")
    stale = registry.model_dir / ".staging-v9-old"
    stale.mkdir()
    os.utime(stale, (0, 0))
    fresh = registry.model_dir / ".staging-v10-now"
    fresh.mkdir()
    assert registry.prune(keep=2) == ["v2", "v3"]
    assert [v.name for v in registry.list_versions()] == ["v1", "v4", "v5"]
    assert not stale.exists() and fresh.exists()
    with pytest.raises(RegistryError):
        registry.prune(keep=0)


def test_metrics_json_is_written(registry):
    registry.add(FakeBundle("v1"), metrics={"accuracy": 0.5})
    assert json.loads((registry.path("v1") / "metrics.json").read_text()) == {"accuracy": 0.5}
    manifest = json.loads((registry.path("v1") / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == {"bundle.pkl", "metrics.json"}


def test_two_registries_on_one_directory_agree(tmp_path):
    a = ModelRegistry(tmp_path, loader=load_fake, saver=save_fake)
    b = ModelRegistry(tmp_path, loader=load_fake, saver=save_fake)
    a.add(FakeBundle("v1"))
    b.promote("v1")
    assert a.current() == "v1"
