"""Revision 0002: model versions in the store (issue 40 item 1, "shared-nothing processes").

Two new tables, `model_versions` (each trained version's bundle as one blob, its SHA-256, size, metrics, when it
was made) and `model_pointer` (the served version), so that the ML backend, the worker, beat and the rater page
share versions through the store's database instead of one SENSE7_HOME's `models/` folder. No existing table
changes, so every row of an older store stays as it was. Versions an older sense7 kept in the folder are moved
into these tables by the registry itself the first time it opens the home (`ModelRegistry.adopt_folder_versions`):
a revision sees the database only, not the folder.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A store re-stamped by hand (its alembic_version dropped, as a test of old stores does) may have them already.
    present = set(sa.inspect(op.get_bind()).get_table_names())
    if "model_versions" not in present:
        _create_model_versions()
    if "model_pointer" not in present:
        _create_model_pointer()


def _create_model_versions() -> None:
    op.create_table(
        "model_versions",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("bundle", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def _create_model_pointer() -> None:
    op.create_table(
        "model_pointer",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("serial", sa.Integer(), nullable=False),
        sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("model_pointer")
    op.drop_table("model_versions")
