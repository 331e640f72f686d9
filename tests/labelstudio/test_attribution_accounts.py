"""Attribution accounts are looked up in Label Studio once per rater, then read from the store
(sense7.store.account_ids): a crowd prepare round or a delivery of a new rater never lists every Label Studio
user (a request that grows with the study). A kept id that went stale is found again. Against the session's
real Label Studio."""

from __future__ import annotations

import secrets

import pytest

from sense7.labelstudio.rater_accounts import account_email, copy_queue, ensure_accounts
from sense7.store.account_ids import AccountIds

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]


class UserCalls:
    """Counts this client's user-list and user-create requests (the real calls go through)."""

    def __init__(self, client):
        self.lists = self.creates = 0
        real_list, real_create = client.users.list, client.users.create

        def listed(*args, **kwargs):
            self.lists += 1
            return real_list(*args, **kwargs)

        def created(*args, **kwargs):
            self.creates += 1
            return real_create(*args, **kwargs)
        client.users.list, client.users.create = listed, created


def users_at(client, email: str) -> list[int]:
    return [u.id for u in client.users.list() if (u.email or "").lower() == email]


def test_new_raters_accounts_are_made_without_listing_users_and_kept_in_the_store(job_stack):
    rt = job_stack.runtime()
    raters = [f"acct{secrets.token_hex(4)}" for _ in range(3)]
    calls = UserCalls(rt.client)
    accounts = ensure_accounts(rt.client, rt.store, raters)
    assert (calls.lists, calls.creates) == (0, 3)  # created first: no list of every user
    assert AccountIds(rt.store).of(raters) == accounts
    assert {r: rt.client.users.get(a).email for r, a in accounts.items()} == {r: account_email(r) for r in raters}

    # Every later look-up reads the store: no request to Label Studio's users at all.
    assert ensure_accounts(rt.client, rt.store, raters[::-1]) == accounts
    assert (calls.lists, calls.creates) == (0, 3)


def test_an_account_made_but_not_kept_is_found_again_not_made_twice(job_stack):
    rt = job_stack.runtime()
    rater = f"acct{secrets.token_hex(4)}"
    made = ensure_accounts(rt.client, rt.store, [rater])[rater]
    AccountIds(rt.store).forget([rater])  # as a job that died between Label Studio's answer and the store
    calls = UserCalls(rt.client)
    assert ensure_accounts(rt.client, rt.store, [rater]) == {rater: made}
    assert calls.lists == 1  # the address was taken: the list finds its owner
    assert users_at(rt.client, account_email(rater)) == [made]
    assert AccountIds(rt.store).of([rater]) == {rater: made}


def test_a_kept_account_deleted_in_label_studio_is_replaced_when_the_queue_is_copied(job_stack):
    rt = job_stack.runtime()
    rater = f"acct{secrets.token_hex(4)}"
    gone = ensure_accounts(rt.client, rt.store, [rater])[rater]
    rt.client.users.delete(gone)  # staff removed the user in Label Studio
    account = copy_queue(rt.client, rt.store, rt.rating_project, rt.profile_project, rt.taxonomy, rater)
    assert account != gone and users_at(rt.client, account_email(rater)) == [account]
    assert AccountIds(rt.store).of([rater]) == {rater: account}
