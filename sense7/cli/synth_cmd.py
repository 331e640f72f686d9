"""`sense7 synth`: write a synthetic study (conversations, raters, ratings) with planted structure."""

from __future__ import annotations

from pathlib import Path

import typer

from sense7.cli._common import console, fail, progress, resolve_taxonomy, taxonomy_option


def synth(
    out: Path = typer.Option(..., "--out", help="directory for conversations.jsonl, raters.csv, ratings.csv "
                             "(and assignments.csv with several raters per conversation)"),
    conversations: int = typer.Option(300, "--conversations", min=1, help="number of conversations"),
    raters: int = typer.Option(40, "--raters", min=1, help="number of raters"),
    seed: int = typer.Option(0, "--seed", help="random seed: the same seed writes byte-identical files"),
    raters_per_conversation: int = typer.Option(1, "--raters-per-conversation", min=1,
                                                help="raters who rate each conversation (the first is its owner: "
                                                     "its line in conversations.jsonl; the others in assignments.csv)"),
    taxonomy: Path = taxonomy_option(),
) -> None:
    """Generate a synthetic study with known structure: lexical cues per empathy behaviour, rater
    leniency and trait-dependent sensitivity, continuity failures and unmet expectations.

    Use it to try the pipeline end to end (`sense7 import`, `sense7 raters import`, `sense7 evaluate`)
    and to check that a model recovers what was planted."""
    from sense7.synthetic.synth import generate, write

    if raters_per_conversation > raters:
        raise fail(f"--raters-per-conversation ({raters_per_conversation}) exceeds --raters ({raters})", 2)
    tax = resolve_taxonomy(taxonomy)
    with progress() as bar:
        job = bar.add_task("Generating", total=None)
        data = generate(conversations, raters, seed, tax, raters_per_conversation=raters_per_conversation)
        bar.update(job, description="Writing")
        paths = write(data, out)
    console.print(f"{len(data.conversations)} conversation(s), {len(data.raters)} rater(s), "
                  f"{len(data.ratings)} rating row(s) written to {out}:")
    for path in paths.values():
        console.print(f"  {path}")


def register(app: typer.Typer) -> None:
    app.command("synth")(synth)
