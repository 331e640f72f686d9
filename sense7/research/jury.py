"""The jury: how would these raters perceive a new assistant?

The served model knows each rater it was trained on (their leniency and sensitivity) and, for a rater with
a profile only, what raters with those traits tend to do. A *panel* of raters is therefore a synthetic
jury: every assistant turn of a set of transcripts is given to every panel member, and the model says how
each of them would most likely have rated it (a distribution over levels per control). Two transcripts of
the same prompts (assistant A vs B) or two panels on the same transcripts are compared with a bootstrap
that resamples both the panel members and the conversations, since a conclusion should hold for other
raters like these *and* other conversations like these.

Panel specs (`parse_panel`, `select_panel`), a small grammar:

    all                                   every rater the model knows or has a profile for
    raters:r001,r002,r017                 exactly these raters
    ai_trust >= 4                         a trait filter: in, not in, ==, !=, <, <=, >, >=
    age_band in [18-24, 25-34] and gender == woman       conditions joined with `and`
    50% ai_trust >= 4; 50% ai_trust < 4; n=20; seed=1    a composition: shares of n, each part drawn
                                                          without replacement from its matches (seeded)

Ordered comparisons are numeric for numeric traits and follow the taxonomy's order for the ordinal
choices (age_band, llm_use); a rater without an answer never matches a condition on that trait.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sense7.data.conversations import Conversation
from sense7.data.dataset import NON_TRAIT_COLUMNS, ORDINAL_PROFILE_FIELDS
from sense7.data.items import trait_table, transcript_columns
from sense7.files import fsync_dir, spreadsheet_cell
from sense7.research.metrics import cluster_draws, percentile_ci
from sense7.taxonomy import Taxonomy

# ---------------------------------------------------------------------------------------------------
# Panel specs

_OPERATORS = ("not in", "in", "==", "!=", "<=", ">=", "<", ">")
_CONDITION = re.compile(r"^\s*([A-Za-z_]\w*)\s*(not\s+in\b|in\b|==|!=|<=|>=|<|>)\s*(.*?)\s*$", re.IGNORECASE)
_SHARE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*(.*)$")
_SETTING = re.compile(r"^\s*(n|seed)\s*=\s*(\S+)\s*$", re.IGNORECASE)


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _trait_names(raters: pd.DataFrame) -> list[str]:
    return [str(c) for c in raters.columns if c not in NON_TRAIT_COLUMNS]


def _profiled(raters: pd.DataFrame) -> list[str]:
    """Raters with at least one trait answer."""
    traits = raters[_trait_names(raters)]
    return [str(r) for r in traits.index[traits.notna().any(axis=1).to_numpy()]] if len(traits.columns) else []


@dataclass(frozen=True)
class Everyone:
    """`all`: the known raters of the model and every rater with a profile."""

    def select(self, raters: pd.DataFrame, known: list[str], taxonomy: Taxonomy) -> list[str]:
        return sorted({str(r) for r in known} | set(_profiled(raters)))

    def __str__(self) -> str:
        return "all"


@dataclass(frozen=True)
class Listed:
    """`raters:a,b,c`: exactly these raters (each must be known to the model or in the raters table)."""

    ids: tuple[str, ...]

    def select(self, raters: pd.DataFrame, known: list[str], taxonomy: Taxonomy) -> list[str]:
        available = {str(r) for r in known} | {str(r) for r in raters.index}
        unknown = [r for r in self.ids if r not in available]
        if unknown:
            raise ValueError(f"unknown rater(s) {', '.join(unknown)}: neither known to the model nor in the "
                             "raters table")
        return list(self.ids)

    def __str__(self) -> str:
        return "raters:" + ",".join(self.ids)


@dataclass(frozen=True)
class Condition:
    trait: str
    op: str  # one of _OPERATORS
    values: tuple[str, ...]  # one value, or the list of `in` / `not in`

    def mask(self, raters: pd.DataFrame, taxonomy: Taxonomy) -> np.ndarray:
        if self.trait not in _trait_names(raters):
            raise ValueError(f"unknown trait {self.trait!r}; the raters' traits are: "
                             f"{', '.join(_trait_names(raters)) or '(none: no rater has a profile)'}")
        column = raters[self.trait]
        answered = column.notna().to_numpy()
        numeric = pd.to_numeric(column, errors="coerce")
        if numeric.notna().sum() == answered.sum() and answered.any():
            have, want = numeric.to_numpy(dtype=float), [self._number(v) for v in self.values]
        elif self.op in ("<", "<=", ">", ">=") and self.trait not in ORDINAL_PROFILE_FIELDS:
            raise ValueError(f"{self.trait} {self.op} ...: {self.trait} is not numeric or ordinal; use == or in")
        elif self.op in ("<", "<=", ">", ">="):  # an ordinal choice: compare positions in the taxonomy
            order = {c: float(i) for i, c in enumerate(self._choices(taxonomy))}
            if self.values[0] not in order:
                raise ValueError(f"{self.trait}: {self.values[0]!r} is not one of {', '.join(order)}")
            have, want = column.map(order).to_numpy(dtype=float), [order[self.values[0]]]
        else:
            have, want = column.astype(str).to_numpy(), list(self.values)
        if self.op in ("in", "not in"):
            hit = np.isin(have, want)
            return answered & (hit if self.op == "in" else ~hit)
        compare = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
                   ">": np.greater, ">=": np.greater_equal}[self.op]
        return answered & compare(have, want[0])

    def _number(self, value: str) -> float:
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{self.trait} is numeric: {value!r} is not a number") from None

    def _choices(self, taxonomy: Taxonomy) -> tuple[str, ...]:
        fields = {f.key: f for f in taxonomy.profile_fields}
        return fields[self.trait].choices if self.trait in fields else ()

    def __str__(self) -> str:
        value = f"[{', '.join(self.values)}]" if self.op in ("in", "not in") else self.values[0]
        return f"{self.trait} {self.op} {value}"


@dataclass(frozen=True)
class Filter:
    """Trait conditions joined with `and`: raters (with a profile) meeting all of them."""

    conditions: tuple[Condition, ...]

    def select(self, raters: pd.DataFrame, known: list[str], taxonomy: Taxonomy) -> list[str]:
        keep = np.ones(len(raters), dtype=bool)
        for condition in self.conditions:
            keep &= condition.mask(raters, taxonomy)
        return sorted(str(r) for r in raters.index[keep])

    def __str__(self) -> str:
        return " and ".join(map(str, self.conditions))


@dataclass(frozen=True)
class Composition:
    """`p1% spec1; p2% spec2; n=N; seed=S`: round(N x share) raters drawn from each part's matches."""

    parts: tuple[tuple[float, object], ...]  # (share in percent, Everyone / Listed / Filter)
    n: int
    seed: int = 0

    def counts(self) -> list[int]:
        """Each part's number of raters: shares of n, rounded so that they sum to n (largest remainders)."""
        exact = np.array([self.n * share / 100 for share, _ in self.parts])
        counts = np.floor(exact + 1e-9).astype(int)
        for i in np.argsort(-(exact - counts), kind="stable")[: self.n - counts.sum()]:
            counts[i] += 1
        return counts.tolist()

    def select(self, raters: pd.DataFrame, known: list[str], taxonomy: Taxonomy) -> list[str]:
        rng = np.random.default_rng(self.seed)
        chosen: list[str] = []
        for (share, spec), count in zip(self.parts, self.counts()):
            matching = spec.select(raters, known, taxonomy)
            available = [r for r in matching if r not in set(chosen)]
            if len(available) < count:
                taken = f" ({len(matching) - len(available)} of them already drawn by an earlier part)" \
                    if len(available) < len(matching) else ""
                raise ValueError(f"{share:g}% {spec}: needs {count} of n={self.n} raters, but only "
                                 f"{len(matching)} match{taken}")
            drawn = rng.choice(len(available), size=count, replace=False)
            chosen += sorted(available[i] for i in drawn)
        return chosen

    def __str__(self) -> str:
        return "; ".join([f"{share:g}% {spec}" for share, spec in self.parts] + [f"n={self.n}", f"seed={self.seed}"])


def _parse_condition(text: str) -> Condition:
    match = _CONDITION.match(text)
    if not match:
        raise ValueError(f"cannot read {text.strip()!r}: expected `trait OP value` with OP one of "
                         f"{', '.join(_OPERATORS)} (e.g. `ai_trust >= 4`, `age_band in [18-24, 25-34]`)")
    trait, op, value = match.group(1), " ".join(match.group(2).lower().split()), match.group(3)
    if op in ("in", "not in"):
        if not (value.startswith("[") and value.endswith("]")):
            raise ValueError(f"{trait} {op}: give a list in brackets, e.g. `{trait} {op} [a, b]`")
        values = tuple(_unquote(v) for v in value[1:-1].split(",") if v.strip())
        if not values:
            raise ValueError(f"{trait} {op} []: the list is empty")
        return Condition(trait, op, values)
    if not value:
        raise ValueError(f"{trait} {op}: no value")
    return Condition(trait, op, (_unquote(value),))


def _parse_simple(text: str):
    text = text.strip()
    if text.lower() == "all":
        return Everyone()
    if text.lower().startswith("raters:"):
        ids = list(dict.fromkeys(r.strip() for r in text[len("raters:"):].split(",") if r.strip()))
        if not ids:
            raise ValueError("raters: lists no rater id")
        return Listed(tuple(ids))
    return Filter(tuple(_parse_condition(part) for part in re.split(r"\s+and\s+", text, flags=re.IGNORECASE)))


def _parse_composition(text: str) -> Composition:
    parts, settings = [], {}
    for piece in (p for p in text.split(";") if p.strip()):
        setting = _SETTING.match(piece)
        if setting:
            key, value = setting.group(1).lower(), setting.group(2)
            if not re.fullmatch(r"\d+", value):
                raise ValueError(f"{key}={value}: expected a whole number")
            settings[key] = int(value)
            continue
        share = _SHARE.match(piece)
        if not share or not share.group(2).strip():
            raise ValueError(f"cannot read {piece.strip()!r} in a composition: expected `SHARE% FILTER`, `n=N` "
                             "or `seed=S`")
        parts.append((float(share.group(1)), _parse_simple(share.group(2))))
    if not parts:
        raise ValueError("a composition needs parts such as `50% ai_trust >= 4`")
    total = sum(share for share, _ in parts)
    if abs(total - 100) > 1e-6:
        raise ValueError(f"the shares sum to {total:g}%, not 100%")
    if not settings.get("n"):
        raise ValueError("a composition needs the panel size: add `; n=20`")
    return Composition(tuple(parts), settings["n"], settings.get("seed", 0))


def parse_panel(spec: str):
    """A panel spec (module docstring) -> Everyone, Listed, Filter or Composition; ValueError if unreadable."""
    text = (spec or "").strip()
    if not text:
        raise ValueError("empty panel spec: give `all`, `raters:ID,ID`, a trait filter or a composition")
    if ";" in text or _SHARE.match(text):
        return _parse_composition(text)
    return _parse_simple(text)


def select_panel(spec: str, raters: pd.DataFrame, known: list[str], taxonomy: Taxonomy) -> list[str]:
    """The rater ids of a panel spec. `raters`: the raw trait frame (index rater_id) as
    `sense7.readers.formats.raters_frame` / `Store.raters_frame()` give it; `known`: the model's known raters."""
    members = parse_panel(spec).select(raters, [str(r) for r in known], taxonomy)
    if not members:
        raise ValueError(f"no rater matches the panel {spec.strip()!r}")
    return members


# ---------------------------------------------------------------------------------------------------
# Predicting the jury

@dataclass(frozen=True)
class JuryResult:
    """Each panel member's predicted rating distribution of each assistant turn, per control."""

    conversation_ids: np.ndarray  # (turns,)
    turn_indices: np.ndarray  # (turns,) index in the conversation's messages
    positions: np.ndarray  # (turns,) 0 = the conversation's first assistant turn (how turns of two assistants match)
    members: list  # (members,) rater ids
    kinds: list  # (members,) "personalized" (rated in training) or "traits" (profile only)
    controls: list
    levels: np.ndarray
    probs: np.ndarray  # (turns, members, controls, levels)
    seated: np.ndarray | None = None  # (turns, members) bool: who judges which turn; None = everyone everything
    label: str = ""

    def seats(self) -> np.ndarray:
        return np.ones(self.probs.shape[:2], bool) if self.seated is None else self.seated

    def expected(self) -> np.ndarray:
        """(turns, members, controls) expected rating."""
        return self.probs @ self.levels.astype(float)

    def level_columns(self) -> list[str]:
        return [f"p_{int(level)}" for level in self.levels]

    def frame(self) -> pd.DataFrame:
        """One row per (turn, seated member, control): conversation_id, turn_index, rater_id, control,
        p_<level>..., expected."""
        n_turns, n_members = self.probs.shape[:2]
        n_controls = len(self.controls)
        keep = np.repeat(self.seats().ravel(), n_controls)
        frame = pd.DataFrame({
            "conversation_id": np.repeat(self.conversation_ids, n_members * n_controls)[keep],
            "turn_index": np.repeat(self.turn_indices, n_members * n_controls)[keep],
            "rater_id": np.tile(np.repeat(np.asarray(self.members, dtype=object), n_controls), n_turns)[keep],
            "control": np.tile(np.asarray(self.controls, dtype=object), n_turns * n_members)[keep],
        })
        probs = self.probs.reshape(-1, len(self.levels))[keep]
        for j, name in enumerate(self.level_columns()):
            frame[name] = probs[:, j]
        frame["expected"] = self.expected().ravel()[keep]
        return frame

    def summary(self) -> pd.DataFrame:
        """One row per (turn, control): the panel's mean expected rating, its mean distribution
        (p_<level>...) and `dissent`, the share of members whose most likely level is not the panel's most
        common most likely level (0 = the panel agrees)."""
        seats = self.seats().astype(float)
        n = seats.sum(axis=1)[:, None]  # (turns, 1)
        mean = np.einsum("tmc,tm->tc", self.expected(), seats) / n
        dist = np.einsum("tmck,tm->tck", self.probs, seats) / n[:, :, None]
        best = self.probs.argmax(axis=3)  # (turns, members, controls)
        votes = np.einsum("tmck,tm->tck", (best[..., None] == np.arange(len(self.levels))).astype(float), seats)
        dissent = 1 - votes.max(axis=2) / n
        n_turns, n_controls = mean.shape
        frame = pd.DataFrame({
            "conversation_id": np.repeat(self.conversation_ids, n_controls),
            "turn_index": np.repeat(self.turn_indices, n_controls),
            "control": np.tile(np.asarray(self.controls, dtype=object), n_turns),
            "mean": mean.ravel(),
        })
        for j, name in enumerate(self.level_columns()):
            frame[name] = dist[:, :, j].ravel()
        frame["dissent"] = dissent.ravel()
        return frame

    def overview(self) -> pd.DataFrame:
        """Per control (index): the mean expected rating and mean distribution over every judged
        (turn, member) pair, and the mean of the per-turn dissent."""
        seats = self.seats().astype(float)
        total = seats.sum()
        out = pd.DataFrame({"mean": np.einsum("tmc,tm->c", self.expected(), seats) / total},
                           index=pd.Index(self.controls, name="control"))
        dist = np.einsum("tmck,tm->ck", self.probs, seats) / total
        for j, name in enumerate(self.level_columns()):
            out[name] = dist[:, j]
        out["dissent"] = self.summary().groupby("control", sort=False)["dissent"].mean().loc[self.controls].to_numpy()
        return out


def _unique_conversations(conversations: list[Conversation]) -> list[Conversation]:
    """One transcript per conversation id: copies for more raters (read_assignments) share the first's text."""
    seen: dict[str, Conversation] = {}
    for conv in conversations:
        seen.setdefault(conv.conversation_id, conv)
    return list(seen.values())


# Probabilities of at most this many (turn, member, control, level) cells are computed at once.
_CHUNK_CELLS = 4_000_000


def jury_predict(model, conversations: list[Conversation], panel: list[str], raters: pd.DataFrame,
                 taxonomy: Taxonomy, seats: dict | None = None, label: str = "") -> JuryResult:
    """Every panel member's predicted ratings of every assistant turn of `conversations`.

    `model`: a ModelBundle or its CompiledBundle. Members the model was trained on get their personalized
    prediction, members with a profile only the trait prior; a member with neither is an error. Each turn
    is read with its conversation's own context. `seats` ({conversation_id: rater ids}, e.g. from an
    assignments file) restricts who judges which conversation; turns nobody on the panel judges, and
    members who judge nothing, are left out."""
    tax = taxonomy
    compiled = model.compile() if hasattr(model, "compile") else model
    members = list(dict.fromkeys(str(m) for m in panel))
    if not members:
        raise ValueError("the panel is empty")
    table = compiled.rater_table(trait_table(raters, tax))
    strangers = [m for m in members if m not in table.index]
    conversations = _unique_conversations(conversations)
    seated = None
    if seats is not None:
        seats = {str(c): {str(r) for r in rs} for c, rs in seats.items()}
        conversations = [c for c in conversations if seats.get(c.conversation_id, set()) & set(members)]
        judging = set().union(*(seats[c.conversation_id] for c in conversations)) if conversations else set()
        members = [m for m in members if m in judging]
        strangers = [m for m in strangers if m in judging]
    if strangers:
        shown = ", ".join(strangers[:20]) + (f" and {len(strangers) - 20} more" if len(strangers) > 20 else "")
        raise ValueError(f"{len(strangers)} panel member(s) have neither ratings the model was trained on nor a "
                         f"profile it can use: {shown}")
    columns = transcript_columns(conversations, tax)
    n_turns = len(columns["conversation_id"])
    if not n_turns:
        raise ValueError("no assistant turn to judge" + (" (no panel member is assigned to any conversation)"
                                                          if seats is not None else ""))
    step = max(1, _CHUNK_CELLS // (len(members) * len(compiled.controls) * len(compiled.levels)))
    probs = np.concatenate([
        compiled.predict_panel({name: values[start:start + step] for name, values in columns.items()}, table, members)
        for start in range(0, n_turns, step)])
    conversation_ids = np.asarray(columns["conversation_id"], dtype=object)
    if seats is not None:
        seated = np.array([[m in seats[c] for m in members] for c in conversation_ids], dtype=bool)
    return JuryResult(
        conversation_ids=conversation_ids,
        turn_indices=np.array(columns["turn_index"], dtype=int),
        positions=np.array(columns["turn_position"], dtype=int) - 1,  # k-th assistant turn, from 0
        members=members,
        kinds=["personalized" if table.known[table.index[m]] else "traits" for m in members],
        controls=list(compiled.controls),
        levels=np.asarray(compiled.levels),
        probs=probs,
        seated=seated,
        label=label,
    )


# ---------------------------------------------------------------------------------------------------
# Comparisons

@dataclass(frozen=True)
class Comparison:
    """Per control, jury b's panel mean minus jury a's, with a two-way (members x conversations) bootstrap CI."""

    kind: str  # "assistants" (same panel, two transcripts) or "panels" (two panels, same transcripts)
    controls: list
    mean_a: np.ndarray  # (controls,)
    mean_b: np.ndarray
    difference: np.ndarray  # mean_b - mean_a
    ci: np.ndarray  # (controls, 2)
    n_turns: int  # matched turns
    n_conversations: int
    n_members: tuple  # (a, b)
    unmatched: tuple  # (turns of a, turns of b) without a counterpart, left out
    n_boot: int
    level: float = 0.95

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({"control": self.controls, "mean_a": self.mean_a, "mean_b": self.mean_b,
                             "difference": self.difference, "ci_low": self.ci[:, 0], "ci_high": self.ci[:, 1]})

    def to_dict(self) -> dict:
        return {"kind": self.kind, "n_turns": self.n_turns, "n_conversations": self.n_conversations,
                "n_members": list(self.n_members), "unmatched": list(self.unmatched), "n_boot": self.n_boot,
                "level": self.level, "controls": self.frame().to_dict(orient="records")}


def _matched(a: JuryResult, b: JuryResult) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a and b holding the same turn: same conversation id, same k-th assistant turn."""
    index_b = {key: i for i, key in enumerate(zip(b.conversation_ids, b.positions))}
    pairs = [(i, index_b[key]) for i, key in enumerate(zip(a.conversation_ids, a.positions)) if key in index_b]
    if not pairs:
        raise ValueError("the two juries share no turn (same conversation id and assistant turn number)")
    rows_a, rows_b = (np.array(p, dtype=int) for p in zip(*pairs))
    return rows_a, rows_b


def _panel_means(expected: np.ndarray, seats: np.ndarray, codes: np.ndarray, n_conversations: int,
                 conversation_draws: np.ndarray, member_draws: np.ndarray) -> np.ndarray:
    """(draws, controls) mean expected rating over (turn, member) pairs, each weighted by its conversation's
    and its member's draw count (the resample in which conversation c appears k times and member m j
    times holds each of their pairs k x j times)."""
    n_turns, n_members, n_controls = expected.shape
    sums = np.zeros((n_conversations, n_members * n_controls))
    np.add.at(sums, codes, (expected * seats[:, :, None]).reshape(n_turns, -1))
    counts = np.zeros((n_conversations, n_members))
    np.add.at(counts, codes, seats.astype(float))
    numerator = np.einsum("bmc,bm->bc", (conversation_draws @ sums).reshape(-1, n_members, n_controls), member_draws)
    denominator = np.einsum("bm,bm->b", conversation_draws @ counts, member_draws)
    with np.errstate(invalid="ignore", divide="ignore"):
        return numerator / denominator[:, None]


def _comparison(kind, a: JuryResult, b: JuryResult, rows_a, rows_b, member_draws_a, member_draws_b,
                n_boot: int, seed: int, level: float) -> Comparison:
    """The shared arithmetic of compare and compare_panels on matched turns."""
    if list(a.controls) != list(b.controls):
        raise ValueError("the two juries predict different controls (different models?)")
    codes, conversations = pd.factorize(a.conversation_ids[rows_a])
    n_conv = len(conversations)
    draws = cluster_draws(n_conv, n_boot, seed)
    ones = np.ones((1, n_conv))
    exp_a, exp_b = a.expected()[rows_a], b.expected()[rows_b]
    seats_a, seats_b = a.seats()[rows_a], b.seats()[rows_b]

    def mean(expected, seats, conversation_draws, member_draws):
        return _panel_means(expected, seats, codes, n_conv, conversation_draws, member_draws)

    point_a = mean(exp_a, seats_a, ones, np.ones((1, exp_a.shape[1])))[0]
    point_b = mean(exp_b, seats_b, ones, np.ones((1, exp_b.shape[1])))[0]
    if kind == "assistants":  # one panel: each resample keeps a member's pair of ratings together
        both = seats_a & seats_b
        boot = mean(exp_b - exp_a, both, draws, member_draws_a)
        point = mean(exp_b - exp_a, both, ones, np.ones((1, exp_a.shape[1])))[0]
    else:  # two panels on the same conversations: members of each panel drawn independently
        boot = mean(exp_b, seats_b, draws, member_draws_b) - mean(exp_a, seats_a, draws, member_draws_a)
        point = point_b - point_a
    ci = np.array([percentile_ci(boot[:, j], level) if n_boot else [np.nan, np.nan]
                   for j in range(len(a.controls))], dtype=float)
    return Comparison(kind=kind, controls=list(a.controls), mean_a=point_a, mean_b=point_b, difference=point,
                      ci=ci, n_turns=len(rows_a), n_conversations=n_conv, n_members=(len(a.members), len(b.members)),
                      unmatched=(len(a.conversation_ids) - len(rows_a), len(b.conversation_ids) - len(rows_b)),
                      n_boot=n_boot, level=level)


def compare(a: JuryResult, b: JuryResult, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> Comparison:
    """The same panel on two assistants' answers to the same prompts: b - a per control.

    Turns match by conversation id and position (the k-th assistant turn); unmatched turns are left out
    and counted. The CI is a percentile bootstrap drawing members and conversations independently."""
    if set(a.members) != set(b.members):
        raise ValueError("compare needs the same panel on both transcripts; for two panels use compare_panels")
    order = [b.members.index(m) for m in a.members]
    b = JuryResult(b.conversation_ids, b.turn_indices, b.positions, list(a.members), [b.kinds[i] for i in order],
                   b.controls, b.levels, b.probs[:, order], None if b.seated is None else b.seated[:, order], b.label)
    rows_a, rows_b = _matched(a, b)
    members = cluster_draws(len(a.members), n_boot, seed + 1)
    return _comparison("assistants", a, b, rows_a, rows_b, members, members, n_boot, seed, level)


def compare_panels(a: JuryResult, b: JuryResult, n_boot: int = 1000, seed: int = 0,
                   level: float = 0.95) -> Comparison:
    """Two panels (counterfactual juries) on the same transcripts: panel b's mean minus panel a's.

    Conversations are drawn once per resample for both panels (the same transcripts); each panel's members
    are drawn independently."""
    rows_a, rows_b = _matched(a, b)
    return _comparison("panels", a, b, rows_a, rows_b, cluster_draws(len(a.members), n_boot, seed + 1),
                       cluster_draws(len(b.members), n_boot, seed + 2), n_boot, seed, level)


# ---------------------------------------------------------------------------------------------------
# Output

def write_csv(frame: pd.DataFrame, path, digits: int = 6) -> Path:
    """Write `frame` as CSV atomically (temporary file in the same folder, fsync, rename), readable by its
    owner only: a reader never sees half a file, and an interrupted run leaves the previous one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as fh:
            safe = frame.assign(**{c: frame[c].map(spreadsheet_cell) for c in frame.columns
                                   if not pd.api.types.is_numeric_dtype(frame[c])})  # texts: never a formula
            safe.to_csv(fh, index=False, float_format=f"%.{digits}f", quoting=csv.QUOTE_MINIMAL)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path
