"""Revision 0005: tasks the rater page shows before Label Studio has them.

One new table, `provisional_tasks` (a provisional id per task key, and Label Studio's id once the task
exists): a crowd participant's questionnaire is written into their queue at the comprehension check, so the
first page after the check is served from the store while the worker's round makes the Label Studio tasks
(sense7.store.rater_page_tables.RaterQueue.provide). It starts empty.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A store re-stamped by hand (its alembic_version dropped, as a test of old stores does) may have it already.
    if "provisional_tasks" not in set(sa.inspect(op.get_bind()).get_table_names()):
        op.create_table(
            "provisional_tasks",
            sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
            sa.Column("rater_id", sa.String(length=200), nullable=False),
            sa.Column("task_key", sa.String(length=400), nullable=False),
            sa.Column("task_id", sa.Integer(), nullable=True),
            sa.Column("made_at", sa.DateTime(timezone=True), nullable=False),
            sa.PrimaryKeyConstraint("id"),
            sa.UniqueConstraint("task_key"),
        )
        op.create_index("ix_provisional_tasks_rater_id", "provisional_tasks", ["rater_id"])


def downgrade() -> None:
    op.drop_index("ix_provisional_tasks_rater_id", table_name="provisional_tasks")
    op.drop_table("provisional_tasks")
