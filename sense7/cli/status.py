"""`sense7 status [--json]`: the study's progress for the project manager (who is done, who rushes)."""

from __future__ import annotations

import json
from collections import Counter

import typer
from rich.table import Table

from sense7.cli._common import console, label_studio_errors, resolve_taxonomy, settings


def _assigned(cfg) -> dict[str, int]:
    """Rating tasks per rater in Label Studio (the system of record), repeats included."""
    from sense7.labelstudio import client as ls_client

    client = ls_client.connect(cfg)
    rating_id, _ = ls_client.ensure_projects(client, cfg, resolve_taxonomy(cfg=cfg))
    return dict(Counter(str((task.data or {}).get("rater_id")) for task in ls_client.iter_tasks(client, rating_id)
                        if (task.data or {}).get("rater_id") is not None))


def status(json_out: bool = typer.Option(False, "--json", help="print the status as JSON (README documents it)")) -> None:
    """Per rater: tasks assigned, done, last activity, median seconds per task and quality flags; totals and
    the pre-fill arms' counts. Reads Label Studio (assigned) and the store (everything else)."""
    from sense7.store.database import Store
    from sense7.research.study_analysis import study_status

    cfg = settings()
    with label_studio_errors(cfg):
        assigned = _assigned(cfg)
    result = study_status(Store(cfg.store_url), assigned, cfg.quality)
    from sense7.cli.crowd import status_lines
    from sense7.crowd.lifecycle import status as crowd_status

    result["crowd"] = crowd_status(Store(cfg.store_url))  # crowd studies: coverage, leases, outcomes
    if json_out:
        print(json.dumps(result, indent=1, allow_nan=False))
        return
    table = Table("rater", "assigned", "done", "last activity", "median s/task", "flags",
                  title="Raters (done = ratings credited to them in the store, repeats included)")
    for row in result["raters"]:
        table.add_row(row["rater_id"], str(row["assigned"]), str(row["done"]), row["last_activity"] or "-",
                      "-" if row["median_seconds"] is None else f"{row['median_seconds']:.1f}",
                      ", ".join(row["flags"]) or "-")
    console.print(table)
    totals, arms = result["totals"], result["arms"]
    console.print(f"{totals['raters']} raters, {totals['done']} of {totals['assigned']} tasks done, "
                  f"{totals['flagged']} flagged. Pre-fill arms: "
                  + ", ".join(f"{arm} {a['done']} of {a['tasks']} done" for arm, a in arms.items()), highlight=False)
    for line in status_lines(result["crowd"]):
        console.print(line, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("status")(status)
