"""Revision 0004: each rater's Label Studio attribution account kept in the store.

One new table, `rater_accounts` (rater id -> Label Studio user id), filled as accounts are found or made
(sense7.labelstudio.rater_accounts.ensure_accounts). Before it, every crowd prepare round and every delivery
of a new rater listed all Label Studio users to find the accounts, a request that grows with the study. It
starts empty: the first look-up of each rater finds their account as before and keeps it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A store re-stamped by hand (its alembic_version dropped, as a test of old stores does) may have it already.
    if "rater_accounts" not in set(sa.inspect(op.get_bind()).get_table_names()):
        op.create_table(
            "rater_accounts",
            sa.Column("rater_id", sa.String(length=200), nullable=False),
            sa.Column("account_id", sa.Integer(), nullable=False),
            sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
            sa.PrimaryKeyConstraint("rater_id"),
        )


def downgrade() -> None:
    op.drop_table("rater_accounts")
