"""The text vectors' rows (table `text_vectors`): what `sense7.model.vector_cache` keeps in the store so that a
text is embedded once per encoder and every process reads its vector. Bytes, keys and shapes only: which
encoder made a vector, and when to compute one, is the cache's business.

Takes an engine, not a `Store`: `local(path)` gives the same rows over a private SQLite file for commands
that have no store (`sense7 evaluate`).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
from sqlalchemy import create_engine, delete, func, select
from sqlalchemy.engine import Engine

from sense7.files import create_private_file
from sense7.store.tables import text_vectors

VECTOR_DTYPES = ("float16", "float32")
READ_CHUNK = 500  # hashes per SELECT ... IN (...): SQLite's bound-parameter limit is far above it


def text_sha256(text: str) -> str:
    """The key of a text: the SHA-256 of its UTF-8 bytes, in hex."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class TextVectorRows:
    def __init__(self, engine: Engine):
        self.engine = engine

    @classmethod
    def local(cls, path) -> "TextVectorRows":
        """The same rows in a private SQLite file of their own (created 0600 with just this table): the cache of
        a command that has no store."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        create_private_file(path)
        engine = create_engine(f"sqlite:///{path}", future=True)
        text_vectors.create(engine, checkfirst=True)
        return cls(engine)

    def vectors(self, encoder_key: str, hashes: list[str]) -> dict[str, np.ndarray]:
        """{text hash: vector (its stored dtype)} of the hashes that have a row for this encoder."""
        c = text_vectors.c
        found: dict[str, np.ndarray] = {}
        with self.engine.connect() as conn:
            for start in range(0, len(hashes), READ_CHUNK):
                chunk = hashes[start:start + READ_CHUNK]
                for sha, dtype, dimension, blob in conn.execute(
                        select(c.text_sha256, c.dtype, c.dimension, c.vector)
                        .where(c.encoder_key == encoder_key, c.text_sha256.in_(chunk))):
                    vector = np.frombuffer(bytes(blob), dtype=np.dtype(dtype).newbyteorder("<"))
                    if len(vector) == dimension:  # (a row of another width is never served)
                        found[sha] = vector.astype(dtype)
        return found

    def add(self, encoder_key: str, vectors: dict[str, np.ndarray]) -> int:
        """Insert the vectors whose (encoder, hash) has no row yet (the first write stays: two processes that
        embed the same text write the same vector); returns how many were new."""
        if not vectors:
            return 0
        now = time.time()
        rows = []
        for sha, vector in vectors.items():
            vector = np.asarray(vector)
            if vector.dtype.name not in VECTOR_DTYPES:
                raise ValueError(f"a text vector is stored as {' or '.join(VECTOR_DTYPES)}, not {vector.dtype}")
            rows.append({"encoder_key": encoder_key, "text_sha256": sha, "dtype": vector.dtype.name,
                         "dimension": int(vector.shape[0]), "created_at": now,
                         "vector": vector.astype(vector.dtype.newbyteorder("<")).tobytes()})
        c = text_vectors.c
        with self.engine.begin() as conn:
            present = set()
            for start in range(0, len(rows), READ_CHUNK):
                chunk = [r["text_sha256"] for r in rows[start:start + READ_CHUNK]]
                present |= set(conn.execute(select(c.text_sha256).where(
                    c.encoder_key == encoder_key, c.text_sha256.in_(chunk))).scalars())
            new = [r for r in rows if r["text_sha256"] not in present]
            if not new:
                return 0
            # (a row another process wrote since the read above is kept: the first write stays)
            for start in range(0, len(new), READ_CHUNK):
                conn.execute(_insert_new(self.engine, new[start:start + READ_CHUNK]))
        return len(new)

    def count(self, encoder_key: str | None = None) -> int:
        query = select(func.count()).select_from(text_vectors)
        if encoder_key is not None:
            query = query.where(text_vectors.c.encoder_key == encoder_key)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar())


def _insert_new(engine: Engine, rows: list[dict]):
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(text_vectors).values(rows).on_conflict_do_nothing(index_elements=["encoder_key", "text_sha256"])
