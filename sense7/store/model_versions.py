"""The model registry's rows (tables `model_versions` and `model_pointer`): what `sense7.model.registry` keeps in
the store so that processes on different hosts share model versions. Bytes and names only: what a bundle is,
and how a process caches it, is the registry's business.

Takes an engine, not a `Store`: `sense7 backup` lists the versions of a store it must not upgrade.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import delete, insert, inspect, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from sense7.store.tables import model_pointer, model_versions

POINTER_ROW = 1


class VersionExists(RuntimeError):
    """A version of that name is in the store already (names are never reused)."""


@dataclass(frozen=True)
class VersionRow:
    """A version's row without its blob."""
    name: str
    created_at: float
    metrics: dict
    sha256: str
    size: int


class ModelVersionRows:
    def __init__(self, engine: Engine):
        self.engine = engine

    def present(self) -> bool:
        """Whether the store has the tables (a store at revision 0001 or older does not)."""
        return inspect(self.engine).has_table(model_versions.name)

    def add(self, row: VersionRow, bundle: bytes) -> None:
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(model_versions).values(
                    name=row.name, created_at=row.created_at, metrics=row.metrics, sha256=row.sha256, size=row.size,
                    bundle=bundle))
        except IntegrityError:
            raise VersionExists(row.name) from None

    def rows(self) -> list[VersionRow]:
        """Every version, oldest first (blobs not read)."""
        c = model_versions.c
        with self.engine.connect() as conn:
            found = conn.execute(select(c.name, c.created_at, c.metrics, c.sha256, c.size)
                                 .order_by(c.created_at, c.name)).all()
        return [VersionRow(name, float(created), dict(metrics or {}), sha, int(size))
                for name, created, metrics, sha, size in found]

    def row(self, name: str) -> VersionRow | None:
        c = model_versions.c
        with self.engine.connect() as conn:
            found = conn.execute(select(c.name, c.created_at, c.metrics, c.sha256, c.size)
                                 .where(c.name == name)).first()
        return None if found is None else VersionRow(found[0], float(found[1]), dict(found[2] or {}), found[3],
                                                     int(found[4]))

    def bundle(self, name: str) -> bytes | None:
        with self.engine.connect() as conn:
            blob = conn.execute(select(model_versions.c.bundle).where(model_versions.c.name == name)).scalar()
        return None if blob is None else bytes(blob)

    def delete(self, name: str) -> bool:
        with self.engine.begin() as conn:
            return conn.execute(delete(model_versions).where(model_versions.c.name == name)).rowcount > 0

    # -- the pointer ---------------------------------------------------------------------------------------------
    def pointer(self) -> tuple[str, int] | None:
        """(served version, promotion serial); None when nothing was ever promoted."""
        with self.engine.connect() as conn:
            found = conn.execute(select(model_pointer.c.version, model_pointer.c.serial)
                                 .where(model_pointer.c.id == POINTER_ROW)).first()
        return None if found is None else (found[0], int(found[1]))

    def point_at(self, name: str) -> None:
        """Serve `name`: one row updated in one transaction (readers see the old pointer or the new one)."""
        now = datetime.now(timezone.utc)
        for _ in range(2):  # two first promotions racing: the loser of the insert updates instead
            with self.engine.begin() as conn:
                moved = conn.execute(update(model_pointer).where(model_pointer.c.id == POINTER_ROW).values(
                    version=name, serial=model_pointer.c.serial + 1, promoted_at=now)).rowcount
            if moved:
                return
            try:
                with self.engine.begin() as conn:
                    conn.execute(insert(model_pointer).values(id=POINTER_ROW, version=name, serial=1,
                                                              promoted_at=now))
                return
            except IntegrityError:
                continue
        raise RuntimeError("the model pointer could not be written")
