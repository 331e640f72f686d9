"""Simulated raters for the demo and the benchmark: each opens their private link and rates over HTTP,
exactly as a person's browser does (questionnaire first, then turns in the page's order), with the ratings
the synthetic rater gave (ratings.csv), and with habits a study must detect (`RaterBehaviour`): keeping a
shown pre-fill with some probability (anchoring), rushing, straight-lining."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pandas as pd
import requests

from sense7.taxonomy import Taxonomy

_FIELD = re.compile(r'name="(csrf_token|revision|rendered_at)" value="([^"]*)"')
_FORM = re.compile(r'data-conversation="([^"]*)" data-turn="(-?\d+)"')
_INSTRUCTED = re.compile(r'data-instructed="([^"]+)"')
_CHECKED = re.compile(r'<input type="radio" name="([^"]+)" value="(\d+)" required checked>')


@dataclass(frozen=True)
class RaterBehaviour:
    """How a simulated rater answers. Time on a turn is drawn from `seconds` and claimed through the form's
    rendered_at (the page measures lead time from it), so a simulation need not wait in real time."""

    seconds: tuple[float, float] = (8.0, 40.0)  # time spent on a turn, uniform
    copy_probability: float = 0.0               # keeps a shown pre-fill (every control) with this probability
    straight_line: int | None = None            # gives this level to every control of every turn
    attentive: bool = True                      # answers an instructed-response item as instructed


def _hidden(html: str) -> dict[str, str]:
    return dict(_FIELD.findall(html))


class SimulatedRater:
    """One rater's browser: a session that opened the link, answering what the page asks next."""

    def __init__(self, link: str, taxonomy: Taxonomy, timeout: float = 60.0):
        self.link, self.taxonomy, self.timeout = link, taxonomy, timeout
        self.http = requests.Session()
        self.base = link.split("/r/", 1)[0]
        self.page: requests.Response | None = None

    def open(self) -> requests.Response:
        self.page = self.http.get(self.link, timeout=self.timeout)
        self.page.raise_for_status()
        return self.page

    def answer_profile(self, traits: dict) -> None:
        form = {**_hidden(self.page.text), **{k: str(v) for k, v in traits.items()}}
        self.page = self.http.post(f"{self.base}/profile", data=form, timeout=self.timeout)
        self.page.raise_for_status()

    def current_turn(self) -> tuple[str, int] | None:
        """(conversation_id, turn_index) of the turn the page shows now, None on any other page."""
        found = _FORM.search(self.page.text) if self.page is not None else None
        return (found.group(1), int(found.group(2))) if found else None

    def prefill(self) -> dict[str, int] | None:
        """The pre-filled levels the page shows now (None when it shows no pre-fill)."""
        if self.page is None or 'id="prefill-note"' not in self.page.text:
            return None
        controls = set(self.taxonomy.controls)
        return {name: int(level) for name, level in _CHECKED.findall(self.page.text) if name in controls}

    def instructed(self) -> str | None:
        """The key of the instructed-response item on the page now, if any."""
        found = _INSTRUCTED.search(self.page.text) if self.page is not None else None
        return found.group(1) if found else None

    def rate(self, values: dict[str, int], expectation: str, seconds: float | None = None,
             extra: dict[str, int] | None = None) -> None:
        hidden = _hidden(self.page.text)
        if seconds is not None and hidden.get("rendered_at"):
            hidden["rendered_at"] = str(float(hidden["rendered_at"]) - seconds)
        form = {**hidden, **{k: str(v) for k, v in {**values, **(extra or {})}.items()},
                self.taxonomy.expectation_key: expectation}
        action = re.search(r'<form method="post" action="([^"]+)"', self.page.text).group(1)
        self.page = self.http.post(f"{self.base}{action}", data=form, timeout=self.timeout)
        self.page.raise_for_status()


def rate_through_page(links: dict[str, str], ratings: pd.DataFrame, traits: dict[str, dict], taxonomy: Taxonomy,
                      fraction: float, workers: int = 4, on_done: Callable[[], None] | None = None,
                      behaviours: dict[str, RaterBehaviour] | None = None,
                      default: RaterBehaviour = RaterBehaviour(), seed: int = 0) -> int:
    """Each rater with a link answers the questionnaire (with their traits) and rates the first `fraction`
    of their turns in the page's order, with their ratings from `ratings` (long ratings.csv frame) as
    `behaviours[rater]` (else `default`) says. Returns the number of turns rated."""
    by_turn = {key: dict(zip(group["dimension"], group["rating"])) for key, group in
               ratings.dropna(subset=["turn_index"]).groupby(["conversation_id", "turn_index", "rater_id"])}
    per_rater = ratings.dropna(subset=["turn_index"]).groupby("rater_id")[["conversation_id", "turn_index"]] \
        .apply(lambda g: len(g.drop_duplicates())).to_dict()

    def one(rater_id: str) -> int:
        habit = (behaviours or {}).get(rater_id, default)
        rng = random.Random(f"{seed}:{rater_id}")
        rater = SimulatedRater(links[rater_id], taxonomy)
        rater.open()
        if rater.page.url.endswith("/profile"):
            rater.answer_profile({k: v for k, v in (traits.get(rater_id) or {}).items()
                                  if k in {f.key for f in taxonomy.profile_fields}})
        # fraction >= 1: everything the page asks, turns it shows a second time included
        quota = float("inf") if fraction >= 1 else max(1, round(per_rater.get(rater_id, 0) * fraction))
        done = 0
        while done < quota and (turn := rater.current_turn()) is not None:
            given = by_turn.get((turn[0], turn[1], rater_id))
            if given is None:  # a turn without a synthetic rating: this simulated rater stops here
                break
            expectation = given.get(taxonomy.expectation_key)
            values = {c: int(given[c]) for c in taxonomy.controls if c in given}
            shown = rater.prefill()
            if habit.straight_line is not None:
                values = {c: habit.straight_line for c in values}
            elif shown and rng.random() < habit.copy_probability:
                values = {c: shown.get(c, v) for c, v in values.items()}
            extra = {}
            check = taxonomy.instructed_item(rater.instructed())
            if check:  # attentive raters do as told; the others answer as they answer everything
                extra[check.key] = check.expected if habit.attentive else \
                    (habit.straight_line or rng.choice([v for v in range(1, taxonomy.levels + 1) if v != check.expected]))
            rater.rate(values, taxonomy.expectation_values[int(expectation) - 1] if expectation else
                       taxonomy.expectation_values[0], seconds=rng.uniform(*habit.seconds), extra=extra)
            done += 1
            if on_done:
                on_done()
        return done

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return sum(pool.map(one, [r for r in links if r in per_rater]))
