"""`sense7 backup --out FILE` and `sense7 restore FILE`: a study's store, model registry, Label Studio database and
secrets in one archive, and back (the work: sense7.backup)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sense7.cli._common import console


def _lines(verb: str, summary: dict) -> str:
    models = f"{summary['model_versions']} model version(s)" + (
        f" (serving {summary['current_model']})" if summary["current_model"] else "")
    return (f"{verb} {summary['files']} files, {summary['bytes']} bytes: the store ({summary['store']}, revision "
            f"{summary['store_revision'] or 'none'}), {models}, Label Studio's database "
            f"({summary['label_studio'] or 'none found'}), {summary['secrets']} secret file(s)")


def backup(out: Path = typer.Option(..., "--out", help="the archive to write (tar.gz, readable by you only)"),
           force: bool = typer.Option(False, "--force", help="replace an existing archive"),
           json_out: bool = typer.Option(False, "--json", help="print the summary as JSON")) -> None:
    """Save the study of SENSE7_HOME in one archive: the store, every model version and the served one, Label
    Studio's database and the home's secrets, with a manifest of sizes and SHA-256 checksums. The stack may keep
    running (SQLite is copied through its backup API, PostgreSQL with pg_dump). Secrets are never printed."""
    from sense7.backup import Target, backup as write_backup

    summary = write_backup(Target.from_env(), out, overwrite=force)
    if json_out:
        print(json.dumps({**summary, "archive": str(out.resolve())}, indent=1))
    else:
        console.print(_lines(f"{out}: saved", summary), highlight=False, soft_wrap=True)


def restore(archive: Path = typer.Argument(..., help="an archive made by `sense7 backup`"),
            force: bool = typer.Option(False, "--force", help="replace the study SENSE7_HOME already holds"),
            json_out: bool = typer.Option(False, "--json", help="print the summary as JSON")) -> None:
    """Bring a study back from `sense7 backup`'s archive into SENSE7_HOME (its store, models, Label Studio
    database and secrets; stop the home's services first). The whole archive is checked before anything is
    written: a tampered, partial or unsafe archive is refused, and so is a home that holds a study already
    (unless --force). Then start the stack as usual: links, queues and the served model go on."""
    from sense7.backup import Target, restore as read_backup

    summary = read_backup(archive, Target.from_env(), force=force)
    if json_out:
        print(json.dumps(summary, indent=1))
    else:
        console.print(_lines(f"{archive}: restored", summary) + f", made {summary['created']} by sense7 "
                      f"{summary['sense7_version']}", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("backup")(backup)
    app.command("restore")(restore)
