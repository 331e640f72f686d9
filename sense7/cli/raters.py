"""`sense7 raters import|invite|revoke|list|withdraw|erase|move-accounts`: rater traits, the raters' private rating
links, withdrawal with erasure (sense7.tasks.erasure), and attribution accounts moved off raters' emails."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import typer

from sense7.cli._common import console, fail, nothing_imported, resolve_taxonomy, settings, taxonomy_option
from sense7.files import spreadsheet_cell, write_private

raters_app = typer.Typer(help="Raters: traits (answers to the profile questionnaire) and private rating links.",
                         no_args_is_help=True)

NOT_RECOVERABLE = "(kept: handed out earlier; only its hash is stored. --rotate --rater ID makes a new one)"


def _store():
    from sense7.store.database import Store

    return Store(settings().store_url)


def _email_conflicts(store, rows: list[dict]) -> list[str]:
    """Emails of `rows` that another rater already has in the store (the store keeps emails unique).
    Names the raters and the email only: never anybody's traits."""
    emails = store.rater_emails()  # rater_id -> email
    emails.update({r["rater_id"]: r["email"] for r in rows})  # as they would be after the import
    owners: dict[str, list[str]] = {}
    for rid, email in emails.items():
        if email:
            owners.setdefault(email, []).append(rid)
    conflicts = []
    for row in rows:
        others = [rid for rid in owners.get(row["email"] or "", []) if rid != row["rater_id"]]
        if others:
            conflicts.append(f"rater {row['rater_id']}: email {row['email']} is already used by rater "
                             f"{', '.join(sorted(others))}")
    return conflicts


@raters_app.command("import")
def raters_import(file: Path = typer.Argument(..., help="CSV: rater_id, email, profile fields of the taxonomy"),
                  taxonomy: Path = taxonomy_option()) -> None:
    """Register or update rater traits in sense7's store (never in Label Studio task data)."""
    from sense7.readers.formats import FormatError, read_raters
    from sense7.store.database import Store

    cfg = settings()
    try:
        rows = read_raters(file, resolve_taxonomy(taxonomy, cfg))
    except FormatError as exc:
        raise nothing_imported(exc)
    store = Store(cfg.store_url)
    conflicts = _email_conflicts(store, rows)
    if conflicts:
        raise fail(f"{file}: {len(conflicts)} email conflict(s), nothing was imported:\n  " + "\n  ".join(conflicts), 2)
    inserted, updated = store.upsert_raters(rows)
    console.print(f"{len(rows)} rater(s): {inserted} new, {updated} updated, "
                  f"{len(rows) - inserted - updated} unchanged")


def _existing_rows(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    with path.open(newline="") as fh:
        return {row["rater_id"]: row for row in csv.DictReader(fh) if row.get("rater_id")}


@raters_app.command()
def invite(
    out: Path = typer.Option(Path("links.csv"), "--out", help="CSV of rater_id,url,email (0600; merged if it exists)."),
    base_url: str = typer.Option(None, "--base-url", help="The rater page's public address (default "
                                 "SENSE7_RATER_PAGE_URL, else http://127.0.0.1:8090)."),
    rater: list[str] = typer.Option(None, "--rater", help="Only these raters (repeatable); default every rater."),
    rotate: bool = typer.Option(False, "--rotate", help="Replace existing links (the old ones stop working)."),
    copy_queues: bool = typer.Option(True, help="Copy the raters' tasks from Label Studio now (needs it running)."),
) -> None:
    """Give every rater one private, unguessable, revocable link to the rater page. Re-running keeps the
    links already handed out (their URLs stay in the CSV you wrote then) and adds links for new raters."""
    from sense7.store.rater_page_tables import LinkBook

    cfg = settings()
    store = _store()
    emails = store.rater_emails()
    known = set(store.raters_frame().index)
    wanted = list(dict.fromkeys(rater)) if rater else sorted(known)
    unknown = [r for r in wanted if r not in known]
    if unknown:
        raise fail(f"--rater: not a known rater: {', '.join(unknown[:5])} (import raters or conversations first); "
                   "no link was created")
    if not wanted:
        raise fail("no raters in the store yet: import conversations or raters first")
    base = (base_url or cfg.rater_page.public_url).rstrip("/")
    previous = _existing_rows(out)
    book = LinkBook(store)
    rows, new, kept = [], 0, 0
    for rater_id in wanted:
        token = book.issue(rater_id, rotate=rotate)
        if token is None:
            kept += 1
            url = previous.get(rater_id, {}).get("url") or NOT_RECOVERABLE
        else:
            new += 1
            url = f"{base}/r/{token}"
        rows.append({"rater_id": rater_id, "url": url, "email": emails.get(rater_id, "")})
    for rater_id, row in previous.items():  # rows of raters not asked for this time stay in the file
        if rater_id not in wanted:
            rows.append({"rater_id": rater_id, "url": row.get("url", ""), "email": row.get("email", "")})
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["rater_id", "url", "email"])
    writer.writeheader()
    writer.writerows({key: spreadsheet_cell(value) for key, value in row.items()}
                     for row in sorted(rows, key=lambda r: r["rater_id"]))
    write_private(out, buffer.getvalue())  # links are credentials
    store.log_staff("raters invite", raters=len(wanted), new_links=new, kept=kept, rotate=rotate)
    console.print(f"{new} new link(s), {kept} kept; written to {out} (0600: each URL is that rater's key)")
    if copy_queues:
        _copy_queues(wanted)


def _copy_queues(rater_ids: list[str]) -> None:
    """Copy the raters' tasks from Label Studio now, so that their first visit reads only the store."""
    from sense7.tasks.delivery import refresh_queues
    from sense7.tasks.runtime import Runtime

    try:
        n = refresh_queues(Runtime(settings()), rater_ids)
    except Exception as exc:  # Label Studio not running: the worker (or the first visit) copies them later
        console.print(f"[yellow]queues not copied yet[/] ({type(exc).__name__}): the worker copies them every "
                      "SENSE7_RATER_QUEUE_INTERVAL s, or a rater's first visit does", highlight=False)
        return
    console.print(f"queues of {n} rater(s) copied from Label Studio")


@raters_app.command()
def revoke(rater_id: str = typer.Argument(..., help="The rater whose link stops working now.")) -> None:
    """Revoke a rater's link: it answers 404 from now on (`invite --rater ID` gives them a new one)."""
    from sense7.store.rater_page_tables import LinkBook

    store = _store()
    if not LinkBook(store).revoke(rater_id):
        raise fail(f"rater {rater_id!r} has no active link")
    store.log_staff("raters revoke", rater_id=rater_id)
    console.print(f"link of {rater_id} revoked")


@raters_app.command("list")
def list_links() -> None:
    """Raters with an active link, when it was made, and their submissions waiting for Label Studio."""
    from sense7.store.rater_page_tables import LinkBook, Outbox

    store = _store()
    for rater_id, created in sorted(LinkBook(store).active().items()):
        console.print(f"{rater_id}\tlink since {created:%Y-%m-%d %H:%M}")
    counts = Outbox(store).counts()
    console.print(f"submissions: {counts['submissions']}, not yet in Label Studio: "
                  f"{counts['undelivered'] + counts['provisional']} ({counts['provisional']} waiting for their task)")


@raters_app.command()
def withdraw(rater_id: str = typer.Argument(..., help="The rater who withdraws from the study.")) -> None:
    """Withdraw a rater and erase them now: their link is revoked at once, then their tasks, annotations and
    attribution account in Label Studio and every row of theirs in the store are deleted, the model is
    retrained without them (versions trained on them are removed once the new one serves). A receipt
    without personal data remains (`sense7 raters erase` lists receipts). Withdrawing twice or an unknown
    id: one error line, nothing changed. Interrupted: `sense7 raters erase --confirm` finishes it."""
    from sense7.crowd.lifecycle import withdraw as settle_crowd_withdrawal
    from sense7.privacy.participation import WithdrawalError, Withdrawals
    from sense7.store.database import staff_user

    store = _store()
    try:
        receipt = Withdrawals(store).request(rater_id, staff_user())
    except WithdrawalError as exc:
        raise fail(str(exc), 2)
    settle_crowd_withdrawal(store, rater_id)  # a crowd participant's slots back to the pool, their seat freed
    store.log_staff("raters withdraw", receipt=receipt)
    console.print(f"withdrawal recorded (receipt {receipt}); link revoked", highlight=False)
    _erase([rater_id])


@raters_app.command()
def erase(confirm: bool = typer.Option(False, "--confirm", help="Erase the pending withdrawals now (without it: "
                                       "list them and the receipts of earlier erasures)."),
          rater: list[str] = typer.Option(None, "--rater", help="Only these pending raters (repeatable).")) -> None:
    """Withdrawals asked for on the rater page wait here for staff: list them, and `--confirm` erases them
    (as `withdraw` does). Re-running after an interruption completes the erasure."""
    from sense7.privacy.participation import Withdrawals

    withdrawals = Withdrawals(_store())
    pending = withdrawals.pending()
    wanted = list(dict.fromkeys(rater)) if rater else None
    unknown = sorted(set(wanted or []) - {w["rater_id"] for w in pending})
    if unknown:
        raise fail(f"--rater: no pending withdrawal of {', '.join(unknown)}; nothing changed", 2)
    if not confirm:
        for w in pending:
            console.print(f"pending\t{w['rater_id']}\tasked by {w['requested_by']} at "
                          f"{w['requested_at']:%Y-%m-%d %H:%M} UTC", highlight=False, markup=False)
        for r in withdrawals.receipts():
            console.print(f"erased\treceipt {r['receipt']}\tasked by {r['requested_by']} at "
                          f"{r['requested_at']:%Y-%m-%d %H:%M}, erased {r['erased_at']:%Y-%m-%d %H:%M} UTC by "
                          f"{r['confirmed_by']}", highlight=False, markup=False)
        console.print(f"{len(pending)} withdrawal(s) waiting; `sense7 raters erase --confirm` erases them",
                      highlight=False)
        return
    if not pending:
        console.print("no withdrawal is waiting", highlight=False)
        return
    _erase(wanted)


def _erase(rater_ids) -> None:
    from sense7.tasks.erasure import erase_withdrawn
    from sense7.tasks.runtime import Runtime

    def report(receipt: dict) -> None:
        store_counts, ls = receipt["store"], receipt["label_studio"]
        rows = sum(v for k, v in store_counts.items() if k not in ("staff_log_redacted", "crowd_withdrawn_kept"))
        kept = (" (a crowd participant: the hash of their pseudonymous id is kept, so that their platform id is "
                "never seated again)" if store_counts.get("crowd_withdrawn_kept") else "")
        console.print(f"erased (receipt {receipt['receipt']}): {rows} store row(s){kept}, {ls.get('tasks', 0)} Label "
                      f"Studio task(s), {ls.get('annotations', 0)} annotation(s), {ls.get('accounts', 0)} "
                      f"account(s)" + (f" ({ls['staff_logins_kept']} staff login(s) with the rater's email "
                                       "kept, their annotations deleted)" if ls.get("staff_logins_kept") else "")
                      + f"; model versions to remove: {', '.join(receipt['model_versions']) or 'none'}",
                      highlight=False, markup=False)

    rt = Runtime(settings())
    try:
        done = erase_withdrawn(rt, rater_ids, on_erased=report)
    except Exception as exc:  # Label Studio unreachable, say: the withdrawal stays pending, re-run finishes
        from sense7.tasks.runtime import describe_error

        raise fail(f"erasure not finished ({describe_error(exc)}); the link stays revoked; "
                   "`sense7 raters erase --confirm` finishes it", 1)
    if done:
        console.print(f"retrain: {done[0].get('retrain', 'not asked')}", highlight=False, markup=False)
        _store().log_staff("raters erase", receipts=[r["receipt"] for r in done])


@raters_app.command("move-accounts")
def move_accounts() -> None:
    """Move the attribution accounts that sense7 made before 2026-11-28 with raters' own emails to their
    reserved addresses (rater-<hash>@raters.sense7.invalid), so that no rater's email stays in Label Studio,
    whose user list every account reads and which shows each annotation's author by email. Each account's
    annotations move with it (only their author changes); staff members' own logins are left alone. Needs
    Label Studio running, and the worker and rater page stopped (they keep the accounts they looked up);
    running it again finishes an interrupted move and otherwise changes nothing."""
    from sense7.labelstudio.rater_accounts import move_accounts as move
    from sense7.tasks.runtime import Runtime, describe_error

    rt = Runtime(settings())
    try:
        counts = move(rt.client, rt.store, [rt.rating_project, rt.profile_project])
    except Exception as exc:
        raise fail(f"accounts not all moved ({describe_error(exc)}); run it again to finish", 1)
    _store().log_staff("raters move-accounts", **counts)
    console.print(f"{counts['accounts']} account(s) moved to reserved addresses with {counts['annotations']} "
                  f"annotation(s); {counts['staff_logins_left']} staff login(s) with a rater's email left alone",
                  highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(raters_app, name="raters")
