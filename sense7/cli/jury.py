"""`sense7 jury`: how would a panel of raters perceive a new assistant's answers? (sense7.research.jury)"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from sense7.cli._common import console, fail, resolve_taxonomy, settings, taxonomy_option

PANEL_HELP = ("who sits on the jury: `all`, `raters:r001,r002`, a trait filter such as `ai_trust >= 4` or "
              "`age_band in [18-24, 25-34] and gender == woman`, or a composition such as "
              "`50% ai_trust >= 4; 50% ai_trust < 4; n=20; seed=1`. Twice: compare two panels")


def _read_inputs(conversations: Path, compare_with: Path | None, assignments: Path | None, raters: Path | None, tax):
    """(transcripts, other transcripts or None, seats or None, raters frame or None); exits 2 on bad input
    with file:line: field: reason, before anything is computed or written."""
    from sense7.readers.formats import raters_frame, read_assignments, read_conversations, read_raters

    for path in (conversations, compare_with, assignments, raters):
        if path is not None and not Path(path).is_file():
            raise fail(f"{path}: file not found", 2)
    try:
        transcripts = read_conversations(conversations, tax)
        other = read_conversations(compare_with, tax) if compare_with else None
        seats = None
        if assignments:
            seats = {}
            for conv in read_assignments(assignments, transcripts):
                seats.setdefault(conv.conversation_id, set()).add(conv.rater_id)
        frame = raters_frame(read_raters(raters, tax, extra_columns=True), tax) if raters else None
    except ValueError as exc:  # sense7.readers.formats.FormatError
        raise fail(str(exc), 2)
    return transcripts, other, seats, frame


def _served_bundle():
    """The promoted model version and its bundle; exits 1 when none was ever promoted."""
    from sense7.model.registry import ModelRegistry

    cfg = settings()
    registry = ModelRegistry.from_settings(cfg)
    version = registry.current()
    if version is None:
        raise fail("no served model in the store: run `sense7 retrain` first", 1)
    from sense7.model.vector_cache import VectorCache, with_vector_cache

    # Its text encoder, if any, reads the store's text vectors (and keeps what it embeds there).
    bundle = registry.load(version)  # RegistryError: one clean line (sense7.cli._common)
    return version, with_vector_cache(bundle, VectorCache.of_store(registry.store))


def _print_summary(juries, labels, comparison) -> None:
    if comparison is None:
        overview = juries[0].overview()
        table = Table(title=f"{labels[0]}: {len(juries[0].members)} raters on {len(juries[0].conversation_ids)} "
                            "assistant turns", caption="panel mean = mean expected rating; dissent = mean share "
                                                       "of members off the panel's commonest level")
        for column in ("control", "panel mean", "most likely", "dissent"):
            table.add_column(column, justify="left" if column == "control" else "right")
        for control, row in overview.iterrows():
            dist = row[juries[0].level_columns()].to_numpy(dtype=float)
            top = int(dist.argmax())
            table.add_row(control, f"{row['mean']:.2f}", f"{juries[0].levels[top]} ({dist[top]:.0%})",
                          f"{row['dissent']:.2f}")
        console.print(table)
        return
    unmatched = comparison.unmatched
    table = Table(title=f"b - a: {labels[1]} vs {labels[0]} ({comparison.n_turns} matched turns, "
                        f"{comparison.n_conversations} conversations)",
                  caption=f"{comparison.level:.0%} CI: bootstrap of panel members and conversations "
                          f"({comparison.n_boot} resamples)"
                          + (f"; left out without a counterpart: {unmatched[0]} turns of a, {unmatched[1]} of b"
                             if any(unmatched) else ""))
    for column in ("control", "a", "b", "b - a", "95% CI"):
        table.add_column(column, justify="left" if column == "control" else "right")
    for row in comparison.frame().itertuples():
        ci = "n/a" if row.ci_low != row.ci_low else f"[{row.ci_low:+.3f}, {row.ci_high:+.3f}]"
        table.add_row(row.control, f"{row.mean_a:.2f}", f"{row.mean_b:.2f}", f"{row.difference:+.3f}", ci)
    console.print(table)


def _stacked(frames: list, labels: list[str]):
    """One frame, with a leading `jury` column (a, b) when there are two juries."""
    import pandas as pd

    if len(frames) == 1:
        return frames[0]
    return pd.concat([f.assign(jury=label)[["jury", *f.columns]] for f, label in zip(frames, labels)],
                     ignore_index=True)


def jury_command(
    conversations: Path = typer.Option(..., help="the new assistant's transcripts (conversations.jsonl, CSV or "
                                                 "OpenAI-style JSONL); each turn is read with its line's context"),
    panel: list[str] = typer.Option(..., metavar="SPEC", help=PANEL_HELP),
    out: Path = typer.Option(..., help="CSV: conversation_id, turn_index, rater_id, control, p_<level>..., expected"
                                       " (with a leading `jury` column a/b when comparing)"),
    summary: Path = typer.Option(None, help="CSV per turn and control: the panel's mean, mean distribution and "
                                            "dissent"),
    report: Path = typer.Option(None, help="write a self-contained HTML report"),
    compare_with: Path = typer.Option(None, help="another assistant's transcripts of the same prompts (same "
                                                 "conversation ids; turns matched by position): b - a"),
    boot: int = typer.Option(1000, min=0, help="bootstrap resamples for the comparison's intervals"),
    seed: int = typer.Option(0, help="bootstrap seed"),
    taxonomy: Path = taxonomy_option(),
    assignments: Path = typer.Option(None, help="CSV conversation_id,rater_id: each conversation is judged only "
                                                "by the panel members assigned to it (and its line's rater)"),
    raters: Path = typer.Option(None, help="raters.csv to read traits from instead of the store"),
) -> None:
    """Predict how a panel of raters would rate every assistant turn of new transcripts, from the served model.

    Raters the model was trained on are predicted from their own ratings, raters with a profile only from
    their traits. With --compare-with (another assistant) or a second --panel, prints b - a per control with
    a bootstrap interval over panel members and conversations."""
    from sense7.research.jury import compare, compare_panels, jury_predict, select_panel, write_csv

    if len(panel) > 2:
        raise fail("--panel: give one panel, or two to compare them", 2)
    if len(panel) == 2 and compare_with is not None:
        raise fail("compare two panels (--panel twice) or two assistants (--compare-with), not both at once", 2)
    tax = resolve_taxonomy(taxonomy)
    transcripts, other, seats, rater_frame = _read_inputs(conversations, compare_with, assignments, raters, tax)
    version, bundle = _served_bundle()
    if rater_frame is None:
        from sense7.store.database import Store

        rater_frame = Store(settings().store_url).raters_frame()
    known = sorted(bundle.known_raters)
    members = []
    for spec in panel:
        try:
            members.append(select_panel(spec, rater_frame, known, tax))
        except ValueError as exc:
            raise fail(f"--panel {spec!r}: {exc}", 2)
    compiled = bundle.compile()
    labels = ["a", "b"] if len(panel) == 2 or other is not None else ["a"]
    try:
        juries = [jury_predict(compiled, transcripts, chosen, rater_frame, tax, seats, label)
                  for chosen, label in zip(members, labels)]
        comparison = None
        if other is not None:
            juries.append(jury_predict(compiled, other, members[0], rater_frame, tax, seats, "b"))
            comparison = compare(juries[0], juries[1], n_boot=boot, seed=seed)
        elif len(juries) == 2:
            comparison = compare_panels(juries[0], juries[1], n_boot=boot, seed=seed)
    except ValueError as exc:
        raise fail(str(exc), 2)
    specs = list(panel) * (2 if other is not None else 1)
    names = [f"{label} = {spec}" if other is None else f"{label} = {path.name}"
             for label, spec, path in zip(labels, specs, (conversations, compare_with))]
    console.print(f"model {version}; " + "; ".join(f"{name}: {len(j.members)} raters "
                                                   f"({j.kinds.count('personalized')} personalized)"
                                                   for name, j in zip(names, juries)), highlight=False)
    write_csv(_stacked([j.frame() for j in juries], labels), out)
    console.print(f"Predictions: {out}")
    if summary:
        write_csv(_stacked([j.summary() for j in juries], labels), summary)
        console.print(f"Summary: {summary}")
    if report:
        from sense7.research.jury_report import write_jury_report

        write_jury_report(report, juries, specs, comparison, rater_frame, version, names)
        console.print(f"Report: {report}")
    _print_summary(juries, names, comparison)


def register(app: typer.Typer) -> None:
    app.command("jury")(jury_command)
