"""The rows of table `rater_accounts`: each rater's Label Studio attribution account id, as
sense7.labelstudio.rater_accounts found or made it. Ids only: which account is a rater's is that module's
business (and `erase_rater_rows` deletes a withdrawn rater's row with the rest of theirs)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Iterable

from sqlalchemy import delete, func, select

from sense7.store.database import Store
from sense7.store.tables import rater_accounts, raters

READ_CHUNK = 500  # rater ids per SELECT ... IN (...)


class AccountIds:
    def __init__(self, store: Store):
        self.store = store

    def of(self, rater_ids: Iterable[str]) -> dict[str, int]:
        """rater id -> account id, for those of these raters whose account is known."""
        query = select(rater_accounts.c.rater_id, rater_accounts.c.account_id)
        with self.store.engine.connect() as conn:
            return _read_in_chunks(conn, query, rater_accounts.c.rater_id, set(rater_ids))

    def raters_of(self, account_ids: Iterable[int] | None = None) -> dict[int, str]:
        """account id -> rater id, for those of these accounts (None: every account) kept as exactly one
        rater's, that rater in the store (an account kept for two raters is nobody's: never guessed between).
        Reads the account_id index (revision 0006), one SELECT per READ_CHUNK accounts."""
        query = (select(rater_accounts.c.account_id, func.min(rater_accounts.c.rater_id))
                 .join(raters, raters.c.rater_id == rater_accounts.c.rater_id)
                 .group_by(rater_accounts.c.account_id)
                 .having(func.count(rater_accounts.c.rater_id) == 1))
        with self.store.engine.connect() as conn:
            if account_ids is None:
                return dict(conn.execute(query).all())
            return _read_in_chunks(conn, query, rater_accounts.c.account_id, {int(a) for a in account_ids})

    def remember(self, accounts: dict[str, int]) -> None:
        """Keep (or replace) these raters' account ids."""
        now = datetime.now(timezone.utc)
        rows = [{"rater_id": r, "account_id": int(a), "updated_at": now} for r, a in accounts.items()]
        with self.store.engine.begin() as conn:
            self.store.upsert_rows(conn, rater_accounts, rows, ["rater_id"])

    def forget(self, rater_ids: Iterable[str]) -> int:
        """Drop these raters' kept ids (an account found gone or replaced): the next look-up finds it again."""
        with self.store.engine.begin() as conn:
            return conn.execute(delete(rater_accounts).where(rater_accounts.c.rater_id.in_(list(rater_ids)))).rowcount


def _read_in_chunks(conn, query, column, values: set) -> dict:
    """The (key, value) rows of `query` where `column` is one of `values`, as a dict: one SELECT per READ_CHUNK
    values, so that a long list (every rater of a crowd burst) stays well under the bound-parameter limit."""
    wanted = sorted(values)
    found: dict = {}
    for start in range(0, len(wanted), READ_CHUNK):
        found.update(conn.execute(query.where(column.in_(wanted[start:start + READ_CHUNK]))).all())
    return found
