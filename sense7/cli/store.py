"""`sense7 store upgrade|revision`: the store's schema revision (sense7.store.migrations)."""

from __future__ import annotations

import json

import typer

from sense7.cli._common import console, settings

store_app = typer.Typer(help="The store's schema: its revision and upgrades (migrations).", no_args_is_help=True)


@store_app.command("upgrade")
def upgrade_store(json_out: bool = typer.Option(False, "--json", help="print what was done as JSON")) -> None:
    """Bring the store to the newest revision this sense7 knows (every process does it when it opens the store;
    this does it now, under the same lock). A store newer than this sense7 is refused and left as it is."""
    from sense7.store.database import Store
    from sense7.store.migrations import display_url, revision_status

    store = Store(settings().store_url)
    done = store.upgraded
    status = revision_status(store.engine)
    result = {**status, "upgraded": done is not None, "from_revision": done.from_revision if done else None,
              "store": display_url(store.engine)}
    if json_out:
        print(json.dumps(result, indent=1))
    elif done is None:
        console.print(f"store {result['store']}: at revision {status['revision']} (the newest), nothing to do",
                      highlight=False, soft_wrap=True)
    else:
        console.print(f"store {result['store']}: upgraded from revision {done.from_revision or 'none'} "
                      f"to {done.to_revision}", highlight=False, soft_wrap=True)


@store_app.command("revision")
def store_revision(json_out: bool = typer.Option(False, "--json", help="print the revisions as JSON")) -> None:
    """The store's revision and the newest this sense7 knows, without upgrading anything."""
    from sqlalchemy import create_engine

    from sense7.store.migrations import check_known, display_url, revision_status

    engine = create_engine(settings().store_url)
    try:
        status = revision_status(engine)
        check_known(status["revision"], engine)
        shown = display_url(engine)
    finally:
        engine.dispose()
    if json_out:
        print(json.dumps({**status, "store": shown}, indent=1))
        return
    state = "up to date" if status["up_to_date"] else "`sense7 store upgrade` brings it to the newest"
    console.print(f"store {shown}: revision {status['revision'] or 'none'}, newest {status['head']} ({state})",
                  highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.add_typer(store_app, name="store")
