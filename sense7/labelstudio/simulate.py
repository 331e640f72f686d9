"""Simulated annotators for the demo: distinct Label Studio users who label tasks through the API with
the ratings a synthetic rater actually gave (ratings.csv), exactly as a person's annotation arrives."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
from label_studio_sdk import LabelStudio

from sense7.labelstudio.protocol import rating_result
from sense7.taxonomy import Taxonomy


def annotation_result(ratings: dict[str, int], taxonomy: Taxonomy) -> list[dict]:
    """A Label Studio result as the rating interface produces it (ratings.csv scores expectation 1..3)."""
    expectation = ratings.get(taxonomy.expectation_key)
    return rating_result(ratings, taxonomy,
                         expectation=taxonomy.expectation_values[int(expectation) - 1] if expectation else None)


def label_tasks(client: LabelStudio, tasks: list, ratings: pd.DataFrame, users: dict[str, int],
                taxonomy: Taxonomy, fraction: float, on_done: Callable[[], None] | None = None,
                workers: int = 4) -> int:
    """Label `fraction` of each rater's unlabeled tasks, earliest turns first, as that rater's user.

    `tasks`: Label Studio tasks with id and data; `ratings`: long ratings frame (ratings.csv)."""
    by_turn = {key: dict(zip(group["dimension"], group["rating"])) for key, group in
               ratings.dropna(subset=["turn_index"]).groupby(["conversation_id", "turn_index", "rater_id"])}
    per_rater: dict[str, list] = {}
    for task in tasks:
        data = task.data or {}
        key = (data.get("conversation_id"), data.get("turn_index"), data.get("rater_id"))
        if key in by_turn and data.get("rater_id") in users and not getattr(task, "total_annotations", 0):
            per_rater.setdefault(data["rater_id"], []).append((key, task.id))
    chosen = []
    for rater_id, items in per_rater.items():
        items.sort(key=lambda item: (item[0][0], item[0][1]))
        chosen += [(rater_id, key, task_id) for key, task_id in items[:max(1, round(len(items) * fraction))]]

    def post(item) -> None:
        rater_id, key, task_id = item
        client.annotations.create(task_id, result=annotation_result(by_turn[key], taxonomy),
                                  completed_by=users[rater_id])
        if on_done:
            on_done()

    # A few annotators at once, as in a real session; each request is one annotation, as the UI sends it.
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(post, chosen))
    return len(chosen)
