"""Small file-system helpers shared by the store of models and anything else that must survive a crash."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable (best effort: some file systems cannot)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` as its owner's only (0600), atomically: a reader never sees half a file.
    For files that hold credentials (rating links) or data."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class FolderNotFree(ValueError):
    """The folder a command was asked to write is a file or holds something: nothing was written."""


@contextlib.contextmanager
def staged_folder(out: Path):
    """Write a new folder all at once: yields an empty staging folder next to `out` (0700); when the block
    ends, every file in it is made 0600 and every folder 0700, and it is renamed to `out`. `out` must be
    new or an empty folder (FolderNotFree otherwise, before anything is written). If the block raises, the
    staging folder and any parent folder made for it are removed: nothing is left behind."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FolderNotFree(f"{out}: {'not a folder' if not out.is_dir() else 'not empty'}; "
                            "give a new or empty folder (nothing was written)")
    made = [parent for parent in reversed(out.parents) if not parent.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield staging
        for path in staging.rglob("*"):
            os.chmod(path, 0o700 if path.is_dir() else 0o600)
        os.chmod(staging, 0o700)
        if out.exists():
            out.rmdir()  # empty (checked above); the rename needs the name free
        os.rename(staging, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for parent in reversed(made):
            try:
                parent.rmdir()
            except OSError:
                pass
        raise
