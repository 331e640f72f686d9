"""The study's design, drawn at import and kept: which tasks show the model's pre-fill, which turns a rater
sees twice, and every prediction made before its rater saw the task.

Why: pre-filling a rater's stars with the model's guess can anchor them, and then the study measures the
model. With the `randomized` policy each (rater, task) draws an arm at import: `shown` (the pre-fill is in
the rating form) or `hidden` (the prediction is made and recorded, never shown). Comparing the arms
measures anchoring (sense7.research.anchoring), and the hidden arm measures how good the served model
really was on ratings it could not influence (sense7.research.live).

Draws are a hash of the study's seed and the task key, so they are reproducible from the recorded seed and
importing the same batch again draws the same arms. A share of each rater's turns is imported a second
time (a "repeat" task, always hidden and placed after every other turn) to measure test-retest agreement.
Tasks imported before this existed carry no arm and count as `shown` (what the study did then).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections import defaultdict
from datetime import datetime, timezone

import pandas as pd
from sqlalchemy import select

from sense7.settings import StudyDesign
from sense7.store.database import Store
from sense7.store.tables import recorded_predictions, study_values, task_arms

SHOWN, HIDDEN = "shown", "hidden"
REPEAT_SUFFIX = "::repeat"
LIVE_KIND = "live"
LIVE_SUFFIX = "+live"  # a live prediction's recorded version: "<served version>+live"


def live_version(version: str) -> str:
    """The recorded version of live predictions of a served version (kept apart from its static ones)."""
    return f"{version}{LIVE_SUFFIX}"


def uniform(seed: str, purpose: str, key: str) -> float:
    """A reproducible draw in [0, 1) for `key` (64 bits of SHA-256 of seed, purpose and key)."""
    digest = hashlib.sha256(f"{seed}\x00{purpose}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


def arm_of(task_data: dict) -> str:
    """The arm a task's data says; tasks without one (imported before the policy existed) were shown."""
    return HIDDEN if (task_data or {}).get("prefill") == HIDDEN else SHOWN


def draw_arm(design: StudyDesign, seed: str, task_key: str) -> str:
    if design.prefill != "randomized":
        return design.prefill
    return SHOWN if uniform(seed, "arm", task_key) < design.shown_share else HIDDEN


def plan(tasks: list[dict], design: StudyDesign, seed: str, taxonomy) -> list[dict]:
    """The rating tasks of a batch with their arm in `data.prefill`, plus each rater's repeat tasks.

    A rater's repeats are the ceil(repeat_share x turns) turns of this batch with the lowest draws; a
    repeat is hidden (a pre-fill would make the second answer a copy of the model, not of the first) and
    carries `repeat_of` = the original's task key. When the taxonomy defines instructed-response items, a
    share of the original turns carries one (`data.instructed` = the item's key, shown by the rater page)."""
    items = list(taxonomy.instructed_items or ())
    out, by_rater = [], defaultdict(list)
    for task in tasks:
        key = task["data"]["task_key"]
        data = {**task["data"], "prefill": draw_arm(design, seed, key)}
        if items and uniform(seed, "instructed", key) < taxonomy.instructed_share:
            data["instructed"] = items[int(uniform(seed, "instructed-item", key) * len(items))].key
        out.append({**task, "data": data})
        by_rater[data["rater_id"]].append(data)
    if design.repeat_share > 0:
        for datas in by_rater.values():
            n = math.ceil(design.repeat_share * len(datas))
            chosen = sorted(datas, key=lambda d: uniform(seed, "repeat", d["task_key"]))[:n]
            for data in chosen:
                repeat = {**data, "task_key": data["task_key"] + REPEAT_SUFFIX, "prefill": HIDDEN,
                          "repeat_of": data["task_key"]}
                repeat.pop("instructed", None)  # the retest asks the turn's ratings only
                out.append({"data": repeat})
    return out


def _now() -> datetime:
    return datetime.now(timezone.utc)


class StudyRecords:
    """The study's arms and recorded predictions in the store."""

    def __init__(self, store: Store):
        self.store = store

    def seed(self, design: StudyDesign) -> str:
        """The design's seed, else the one drawn at this study's first import (kept, so every later batch
        and every analysis uses the same one)."""
        if design.seed:
            return design.seed
        with self.store.engine.begin() as conn:
            value = conn.scalar(select(study_values.c.value).where(study_values.c.name == "prefill_seed"))
            if value is None:
                value = secrets.token_hex(8)
                self.store.upsert_rows(conn, study_values, [{"name": "prefill_seed", "value": value}], ["name"])
                value = conn.scalar(select(study_values.c.value).where(study_values.c.name == "prefill_seed"))
        return value

    def record_arms(self, tasks: list[dict], design: StudyDesign, seed: str) -> None:
        """Keep the arm of each planned task (idempotent: a task keeps the arm it first drew)."""
        rows = [{"task_key": d["task_key"], "conversation_id": str(d["conversation_id"]),
                 "turn_index": int(d["turn_index"]), "rater_id": str(d["rater_id"]), "arm": d["prefill"],
                 "policy": design.prefill, "shown_share": design.shown_share, "seed": seed,
                 "repeat_of": d.get("repeat_of"), "drawn_at": _now()} for d in (t["data"] for t in tasks)]
        with self.store.engine.begin() as conn:
            for start in range(0, len(rows), 500):
                self.store.upsert_rows(conn, task_arms, rows[start:start + 500], ["task_key"], keep_existing=True)

    def record_predictions(self, rows: list[dict]) -> None:
        """Keep predictions (one per task key and model version; the first one made is the one kept,
        which is the one made before the rater could see the task)."""
        stamped = [{**r, "recorded_at": r.get("recorded_at") or _now()} for r in rows]
        with self.store.engine.begin() as conn:
            for start in range(0, len(stamped), 500):
                self.store.upsert_rows(conn, recorded_predictions, stamped[start:start + 500],
                                       ["task_key", "version"], keep_existing=True)

    def recorded(self, task_key: str, version: str) -> dict | None:
        """The prediction kept for (task key, version), or None."""
        with self.store.engine.connect() as conn:
            row = conn.execute(select(recorded_predictions).where(recorded_predictions.c.task_key == task_key,
                                                                  recorded_predictions.c.version == version)
                               ).mappings().first()
        return dict(row) if row else None

    def arm(self, task_key: str) -> str:
        """The arm the task drew (tasks without one were imported before the policy existed: shown)."""
        with self.store.engine.connect() as conn:
            value = conn.scalar(select(task_arms.c.arm).where(task_arms.c.task_key == task_key))
        return value or SHOWN

    def recorded_keys(self, version: str) -> set[str]:
        with self.store.engine.connect() as conn:
            return set(conn.scalars(select(recorded_predictions.c.task_key)
                                    .where(recorded_predictions.c.version == version)))

    def arms_frame(self) -> pd.DataFrame:
        with self.store.engine.connect() as conn:
            rows = conn.execute(select(task_arms)).mappings().all()
        return pd.DataFrame([dict(r) for r in rows], columns=[c.name for c in task_arms.columns])

    def predictions_frame(self) -> pd.DataFrame:
        with self.store.engine.connect() as conn:
            rows = conn.execute(select(recorded_predictions).order_by(recorded_predictions.c.recorded_at)).mappings().all()
        return pd.DataFrame([dict(r) for r in rows], columns=[c.name for c in recorded_predictions.columns])

    def arm_counts(self) -> dict[str, int]:
        frame = self.arms_frame()
        frame = frame[frame["repeat_of"].isna()] if len(frame) else frame
        return {arm: int((frame["arm"] == arm).sum()) if len(frame) else 0 for arm in (SHOWN, HIDDEN)}
