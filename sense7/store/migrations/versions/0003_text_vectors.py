"""Revision 0003: text vectors in the store (issue 39 item 1, "embed once").

One new table, `text_vectors`: a text encoder's vector of a text, keyed by (encoder key, SHA-256 of the text), so
that each distinct text is embedded once per encoder and every process (ML backend, worker, rater page, on any
host) reads it instead of computing it again; it starts empty and fills as conversations enter (the
`sense7.embed_texts` job) or as texts are first read. One new nullable column, `recorded_predictions.text_vectors`:
whether a recorded prediction read its texts' vectors ("embedded") or was made by the lexical part alone
("lexical"); rows recorded before stay NULL (their models had no cached encoder).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A store re-stamped by hand (its alembic_version dropped, as a test of old stores does) may have them already.
    inspector = sa.inspect(op.get_bind())
    if "text_vectors" not in set(inspector.get_table_names()):
        _create_text_vectors()
    if "text_vectors" not in {c["name"] for c in inspector.get_columns("recorded_predictions")}:
        with op.batch_alter_table("recorded_predictions") as batch:
            batch.add_column(sa.Column("text_vectors", sa.String(length=16), nullable=True))


def _create_text_vectors() -> None:
    op.create_table(
        "text_vectors",
        sa.Column("encoder_key", sa.String(length=64), nullable=False),
        sa.Column("text_sha256", sa.String(length=64), nullable=False),
        sa.Column("dtype", sa.String(length=8), nullable=False),
        sa.Column("dimension", sa.Integer(), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("encoder_key", "text_sha256"),
    )


def downgrade() -> None:
    with op.batch_alter_table("recorded_predictions") as batch:
        batch.drop_column("text_vectors")
    op.drop_table("text_vectors")
