"""`sense7 demo` and `sense7 down`: the main job, from nothing to a learning, pre-annotated project.

Each phase is idempotent, so re-running the demo reuses what exists. Everything it starts is recorded
under SENSE7_HOME/run, so `sense7 down` (or Ctrl-C during the demo) stops exactly that.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import typer

from sense7 import ls_client, synth
from sense7.cli._common import console, err_console, fail, settings
from sense7.formats import FormatError, read_conversations, read_raters
from sense7.importer import import_conversations, import_profile_tasks
from sense7.ls_server import LabelStudioServer, ServerError
from sense7.store import Store


class Phases:
    """Times each phase and shows it, so a slow step is visible and the wall time can be recorded."""

    def __init__(self):
        self.timings: list[tuple[str, float]] = []

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        with err_console.status(f"{name} ..."):
            yield
        elapsed = time.perf_counter() - start
        self.timings.append((name, elapsed))
        err_console.print(f"[green]done[/] {name} ({elapsed:.1f} s)")

    def table(self) -> str:
        total = sum(t for _, t in self.timings)
        rows = [f"| {name} | {t:.1f} |" for name, t in self.timings]
        return "\n".join(["| phase | seconds |", "| --- | --- |", *rows, f"| **total** | **{total:.1f}** |"])


def demo(
    conversations: Path = typer.Option(None, help="your own conversations file (default: a synthetic batch)"),
    raters: Path = typer.Option(None, help="your own raters CSV (with --conversations)"),
    n_conversations: int = typer.Option(60, "--n-conversations", help="size of the synthetic batch"),
    n_raters: int = typer.Option(6, "--n-raters", help="raters in the synthetic batch"),
    seed: int = typer.Option(7, help="seed of the synthetic batch"),
) -> None:
    """Start Label Studio and create, fill and pre-annotate the SENSE-7 projects, then show where to look."""
    cfg = settings()
    phases = Phases()
    server = LabelStudioServer(cfg)
    try:
        with phases.phase(f"Label Studio on {cfg.ls_url}"):
            server.start()
    except ServerError as exc:
        raise fail(str(exc))
    client = ls_client.connect(cfg)
    with phases.phase("rating and profile projects"):
        rating_id, profile_id = ls_client.ensure_projects(client, cfg)
    data_dir = cfg.home / "demo-data"
    if conversations is None:
        with phases.phase(f"synthetic batch ({n_conversations} conversations, {n_raters} raters)"):
            synth.write(synth.generate(n_conversations, n_raters, seed), data_dir)
        conversations, raters = data_dir / "conversations.jsonl", data_dir / "raters.csv"
    store = Store(cfg.store_url)
    try:
        with phases.phase("import and rater traits"):
            batch = read_conversations(conversations)
            trait_rows = read_raters(raters) if raters else []
            result = import_conversations(client, rating_id, batch, store)
            import_profile_tasks(client, profile_id, sorted({c.rater_id for c in batch}))
            store.upsert_raters(trait_rows)
    except FormatError as exc:
        err_console.print(str(exc), markup=False)
        raise typer.Exit(2)
    (cfg.home / "demo-timings.md").write_text(phases.table() + "\n")
    console.print()
    console.print(f"[bold]Label Studio:[/] {cfg.ls_url}/projects/{rating_id}  "
                  f"({result.created} new tasks, {result.tasks_in_batch} in the batch)")
    console.print(f"[bold]Login:[/] {cfg.ls_admin_email} / password in {cfg.home / 'secrets' / 'ls_password'}")
    console.print(f"Phase timings: {cfg.home / 'demo-timings.md'}.  Stop everything with `sense7 down`.")


def down() -> None:
    """Stop everything `sense7 demo` started (Label Studio, ML backend, Celery worker)."""
    cfg = settings()
    stopped = LabelStudioServer(cfg).stop()
    console.print("Label Studio stopped" if stopped else "Label Studio was not running")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
    app.command("down")(down)
