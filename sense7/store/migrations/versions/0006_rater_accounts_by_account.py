"""Revision 0006: the kept attribution accounts indexed by account id.

The sync reads an annotation's author (a Label Studio user id) back to its rater from `rater_accounts`
(sense7.store.account_ids.AccountIds.raters_of) instead of listing every Label Studio user: one indexed
query per author. No rows change.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

INDEX = "ix_rater_accounts_account_id"


def upgrade() -> None:
    # A store re-stamped by hand (its alembic_version dropped, as a test of old stores does) may have it already.
    existing = {index["name"] for index in sa.inspect(op.get_bind()).get_indexes("rater_accounts")}
    if INDEX not in existing:
        op.create_index(INDEX, "rater_accounts", ["account_id"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="rater_accounts")
