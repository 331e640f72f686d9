"""A study in the layout of the LeWiDi shared tasks (Learning with Disagreements, 3rd edition 2025: the
perspectivist format of its CSC, MP, Par and VariErrNLI data sets), so a study can be set next to the field's
benchmarks and read by the task's own code (`sense7 export --format lewidi`).

Each control is one data set, in its own folder as LeWiDi's are (`CSC/CSC_train.json`):
- `<control>/<control>_train.json`: one JSON object keyed by item id ("1", "2", ...); an item is a rated
  assistant turn with the fields of the task's common format: `annotation task`, `text` (`context`: the
  conversation before the turn, `response`: the turn, as CSC's), `number of annotators`, `annotators`
  (comma-separated ids), `number of annotations`, `annotations` ({annotator: label as a string}),
  `soft_label` ({level: share of the item's annotations}, every level of the scale in order), `split`
  ("train": a study has no split of its own), `lang`, `other_info` (the conversation's pseudonym, the
  turn, the control).
- `<control>/<control>_annotators_meta.json`: {annotator id: {profile field: answer}} for every rater.
The starting kit's reader takes `list(soft_label.values())` as the target distribution and
`[int(annotations[a]) for a in annotators.split(",")]` as the perspectivist targets: labels are integer
strings and ids hold no comma. Annotators are the export's pseudonyms (`Ann<n>`, LeWiDi's own style).
Test-retest repeats and ratings of a whole conversation are left out (one label per annotator and turn).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from sense7.privacy.croissant import Column, RecordTable, croissant_document, datasheet_lines, write_croissant

SPLIT = "train"


def _number(pseudonym) -> int:
    """Ann12 -> 12: items and annotators are listed in the pseudonyms' order."""
    found = re.search(r"(\d+)$", str(pseudonym))
    return int(found.group(1)) if found else 0


def _answer(value):
    """A profile answer as JSON: None when missing, an int for a number field's answer, else the text."""
    if value is None or pd.isna(value):
        return None
    return int(value) if isinstance(value, (int, float, np.integer, np.floating)) else str(value)


def conversation_texts(export) -> dict[str, list[tuple[str, str]]]:
    """conversation pseudonym -> its messages as (role, content), in order (read once for every control)."""
    frame = export.frames["conversations"].sort_values(["conversation", "message_index"], kind="stable")
    texts: dict[str, list] = {}
    for conversation, role, content in zip(frame["conversation"], frame["role"], frame["content"]):
        texts.setdefault(str(conversation), []).append((str(role), str(content)))
    return texts


def lewidi_items(export, control: str, texts: dict | None = None) -> dict[str, dict]:
    """The items of one control: {item id: item} (ids follow conversation and turn order). `texts`:
    conversation_texts(export), when already read."""
    tax = export.taxonomy
    texts = conversation_texts(export) if texts is None else texts
    ratings = export.frames["ratings"]
    rows = ratings[(ratings["dimension"] == control) & ~ratings["is_repeat"].astype(bool) & ratings["turn_index"].notna()]
    with_ids = "store_conversation_id" in rows
    labels_of: dict[tuple, dict] = {}
    store_id_of = {}
    store_ids = rows["store_conversation_id"] if with_ids else [None] * len(rows)
    for conversation, turn, rater, rating, store_id in zip(rows["conversation"], rows["turn_index"], rows["rater"],
                                                           rows["rating"], store_ids):
        key = (str(conversation), int(turn))
        labels_of.setdefault(key, {})[str(rater)] = int(rating)  # one label per annotator: the last one
        store_id_of[key] = store_id
    title = next((d.title for d in (*tax.dimensions, tax.overall) if d.key == control), control)
    items = {}
    for item_id, key in enumerate(sorted(labels_of, key=lambda k: (_number(k[0]), k[1])), start=1):
        conversation, turn = key
        annotators = sorted(labels_of[key], key=_number)
        labels = [labels_of[key][a] for a in annotators]
        messages = texts.get(conversation, [])
        other = {"conversation": conversation, "turn_index": turn, "dimension": control}
        if with_ids:
            other["store_conversation_id"] = str(store_id_of[key])
        items[str(item_id)] = {
            "annotation task": f"empathy rating: {title}",
            "text": {"context": "\n".join(f"{role}: {content}" for role, content in messages[:turn]),
                     "response": messages[turn][1] if turn < len(messages) else ""},
            "number of annotators": len(annotators),
            "annotators": ",".join(annotators),
            "number of annotations": len(labels),
            "annotations": {a: str(v) for a, v in zip(annotators, labels)},
            "soft_label": {str(level): labels.count(level) / len(labels) for level in range(1, tax.levels + 1)},
            "split": SPLIT,
            "lang": "en",
            "other_info": other,
        }
    return items


def annotators_meta(export) -> dict[str, dict]:
    """{annotator id: {profile field: answer (None when not answered)}}, and the store's id with --with-ids."""
    raters = export.frames["raters"]
    fields = [f.key for f in export.taxonomy.profile_fields]
    extra = ["store_rater_id"] if "store_rater_id" in raters else []
    meta = {}
    for row in raters.to_dict("records"):
        meta[str(row["rater"])] = {k: _answer(row[k]) for k in fields + extra}
    return meta


def _item_columns(control: str) -> tuple[Column, ...]:
    return (Column("annotators", "text", "comma-separated annotator ids of the item", "$.*.annotators"),
            Column("number_of_annotators", "integer", "annotators of the item", "$.*['number of annotators']"),
            Column("conversation", "text", "the conversation's pseudonym", "$.*.other_info.conversation"),
            Column("turn_index", "integer", "the rated turn's index in the conversation", "$.*.other_info.turn_index"))


def write_lewidi(export, folder: Path, rai: dict) -> None:
    """Write the LeWiDi layout of `export` into `folder`, with a README and croissant.json (same RAI fields)."""
    tax = export.taxonomy
    meta = annotators_meta(export)
    texts = conversation_texts(export)
    files, tables, counts = {}, [], {}
    for control in tax.controls:
        (folder / control).mkdir()
        items = lewidi_items(export, control, texts)
        counts[control] = len(items)
        train, meta_path = f"{control}/{control}_{SPLIT}.json", f"{control}/{control}_annotators_meta.json"
        (folder / train).write_text(json.dumps(items, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        (folder / meta_path).write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        files[train] = f"{control}: items (rated turns) with each annotator's label and the soft label"
        files[meta_path] = "the annotators' profile answers"
        tables.append(RecordTable(f"{control}_items", train, f"the rated turns of {control}", _item_columns(control)))
    (folder / "README.md").write_text(_readme(export, counts, rai), encoding="utf-8")
    write_croissant(folder, croissant_document(
        folder, "sense7 study export (LeWiDi layout)", "Per-turn empathy ratings in the perspectivist layout of the "
        "LeWiDi shared tasks: one data set per control, each item's annotations by annotator and its soft label.",
        files, tables, rai, "Not for redistribution: the study team's export (see README.md)",
        keywords=["empathy", "perspectivism", "LeWiDi", "soft labels"]))


def _readme(export, counts: dict[str, int], rai: dict) -> str:
    tax = export.taxonomy
    rows = "\n".join(f"| {control} | {counts[control]} |" for control in tax.controls)
    return f"""# Per-turn empathy ratings in the LeWiDi layout

Written by `sense7 export --format lewidi`: one data set per control, in the format of the LeWiDi 2025 shared
task (`<control>/<control>_train.json`, `<control>/<control>_annotators_meta.json`). Labels are the
{tax.levels}-point scale's levels 1-{tax.levels} ({", ".join(tax.scale)}); the soft label lists every level.
Annotators are this export's pseudonyms; test-retest repeats and ratings of whole conversations are left out.

## Counts
| data set | items |
| --- | --- |
{rows}

## Questionnaire
Profile (the annotators' metadata): {", ".join(f.key for f in tax.profile_fields)}.

## Responsible-AI fields (the same as in croissant.json)
""" + "\n".join(datasheet_lines(rai)) + "\n"
