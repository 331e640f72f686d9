"""Synthetic conversations, raters and ratings with planted, known structure.

What is planted (and kept in `SynthData.truth`, so `sense7.model.oracle.SynthOracle` can compute the true
expected rating of every (turn, rater, control)):
- every assistant turn shows or lacks each behaviour through **lexical cues** (acknowledgement phrases,
  a reflected detail, validating words, a question, a reference back to an earlier named detail, a tone
  marker, a concrete step); positive cues raise the turn's latent quality on that dimension, negative cues
  lower it;
- **continuity failures** (the assistant forgets the named detail) and **unmet expectations** (much empathy
  wanted but none shown, or a jarring tone) lower that turn and, decaying, the next turns; the rater's
  answer to "did it meet what you expected?" is written as dimension `expectation_met` (1 no, 2 partly,
  3 yes);
- **raters** differ in leniency (partly from their traits: AI attitude and agreeableness, partly
  idiosyncratic) and in sensitivity per dimension (agreeable raters weigh acknowledgement and validation
  more, frequent LLM users punish continuity failures more);
- a rating is the latent mean plus Gaussian noise, cut into levels at fixed thresholds.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sense7.data.conversations import Conversation, Message
from sense7.files import spreadsheet_rows
from sense7.taxonomy import Taxonomy

def _phrases() -> dict:
    """The phrases synthetic conversations are made of (phrases.yaml beside this module: content, kept as data)."""
    import yaml

    return yaml.safe_load((Path(__file__).with_name("phrases.yaml")).read_text(encoding="utf-8"))


_PHRASES = _phrases()
CUES: dict[str, dict[int, list[str]]] = _PHRASES["cues"]  # per dimension: 1 shows the behaviour, -1 its failure
TOPICS = [(t["problem"], t["echo"], t["step"]) for t in _PHRASES["topics"]]
NAMES: list[str] = _PHRASES["names"]
EMOTIONS: list[str] = _PHRASES["emotions"]
FOLLOW_UPS: list[str] = _PHRASES["follow_ups"]
# Latent model constants (the truth the oracle uses).
BASE = 3.0
NOISE_SD = 0.7
CUE_WEIGHT = 0.9
FAILURE_PENALTY = (0.8, 0.4, 0.2)  # this turn, next turn, the one after
UNMET_PENALTY = (0.35, 0.15)


@dataclass
class SynthTruth:
    """The generating parameters: enough to compute each rating's distribution exactly."""

    thresholds: np.ndarray  # cut points between levels on the latent scale
    noise_sd: float
    latent: pd.DataFrame  # conversation_id, turn_index (Int64, NA = whole conversation), rater_id, one mean per control
    leniency: pd.Series  # per rater: total offset (trait part + idiosyncratic)
    trait_leniency: pd.Series  # per rater: the part explained by traits
    sensitivity: pd.DataFrame  # rater x control multiplier of the turn's cue quality
    cues: pd.DataFrame  # conversation_id, turn_index, one cue state (-1/0/1) per dimension
    # The latent means an average rater would have (sensitivities and failure weight 1, no leniency or
    # per-control offsets; the rater's own context kept): the rater-blind oracle, i.e. a perfect text and
    # context model that knows nothing of the rater. Same keys and columns as `latent`.
    population_latent: pd.DataFrame | None = None


@dataclass
class SynthData:
    conversations: list[Conversation]
    raters: pd.DataFrame  # raters.csv: rater_id, email, profile fields
    ratings: pd.DataFrame  # ratings.csv rows
    truth: SynthTruth = field(repr=False)
    taxonomy: Taxonomy = field(repr=False)  # the one it was generated for (its controls and scale)

    def rating_data(self):
        """The same data as `sense7.readers.formats.load_native` would read from the written files."""
        from sense7.data.dataset import RatingData

        raters = self.raters.set_index("rater_id")
        conversations = {(c.conversation_id, c.rater_id): c for c in self.conversations}
        ratings = self.ratings.copy()
        ratings["turn_index"] = ratings["turn_index"].astype("Int64")
        return RatingData(conversations, ratings, raters)


def _profile(rng: np.random.Generator, tax: Taxonomy) -> dict:
    out = {}
    for fld in tax.profile_fields:
        if fld.type == "choice":
            out[fld.key] = fld.choices[int(rng.integers(len(fld.choices)))]
        else:
            out[fld.key] = int(rng.integers(fld.min, fld.max + 1))
    return out


def _z(value: float, low: float, high: float) -> float:
    """Standardize a uniform answer on [low, high] by its theoretical mean and sd (seed-independent)."""
    mean, sd = (low + high) / 2, (high - low) / np.sqrt(12)
    return (value - mean) / sd


def generate(n_conversations: int, n_raters: int, seed: int, taxonomy: Taxonomy,
             raters_per_conversation: int = 1, whole_conversation_share: float = 0.1) -> SynthData:
    if n_conversations < 1 or n_raters < 1:
        raise ValueError("need at least one conversation and one rater")
    if not 1 <= raters_per_conversation <= n_raters:
        raise ValueError(f"raters_per_conversation must be 1-{n_raters}")
    rng = np.random.default_rng(seed)
    dims = [d.key for d in taxonomy.dimensions]
    controls = taxonomy.controls
    levels = taxonomy.levels
    base = (levels + 1) / 2  # the middle of the taxonomy's scale: BASE (3) on 1..5, 4 on 1..7
    thresholds = base + np.arange(levels - 1) - (levels - 2) / 2  # 1..5 -> cuts 1.5..4.5 around 3

    # -- raters --------------------------------------------------------------------------------------
    rater_ids = [f"r{i:03d}" for i in range(1, n_raters + 1)]
    profiles, leniency, trait_len, sens = [], {}, {}, {}
    fields = {f.key: f for f in taxonomy.profile_fields}
    llm_choices = fields["llm_use"].choices if "llm_use" in fields else ("never",)
    for rid in rater_ids:
        prof = _profile(rng, taxonomy)
        profiles.append({"rater_id": rid, "email": f"{rid}@example.org", **prof})
        agree = (_z(prof.get("tipi_7", 4), 1, 7) + _z(8 - prof.get("tipi_2", 4), 1, 7)) / 2
        ai_emotional = _z(prof.get("ai_emotional", 3), 1, 5)
        ai_concern = _z(prof.get("ai_concern", 3), 1, 5)
        llm = _z(llm_choices.index(prof["llm_use"]) if "llm_use" in prof else 0, 0, len(llm_choices) - 1)
        trait_part = 0.35 * ai_emotional + 0.25 * agree - 0.2 * ai_concern
        trait_len[rid] = trait_part
        leniency[rid] = trait_part + rng.normal(0, 0.6)
        s = {}
        for d in controls:
            value = 1.0 + rng.normal(0, 0.2)
            if d in ("acknowledgement", "validation"):
                value += 0.35 * agree
            if d == "continuity":
                value += 0.35 * llm
            s[d] = float(np.clip(value, 0.2, 2.0))
        s["_failure"] = float(np.clip(1 + 0.4 * llm, 0.3, 2.0))  # how much failures hurt this rater
        s["_offsets"] = rng.normal(0, 0.2, size=len(controls))  # idiosyncratic per-control leniency
        sens[rid] = s
    raters = pd.DataFrame(profiles)

    # -- conversations and ratings -------------------------------------------------------------------
    conversations, rating_rows, latent_rows, cue_rows, population_rows = [], [], [], [], []
    ctx_fields = {f.key: f for f in taxonomy.context_fields}
    for ci in range(1, n_conversations + 1):
        conv_id = f"c{ci:04d}"
        problem_t, echo_t, step_t = TOPICS[int(rng.integers(len(TOPICS)))]
        name = NAMES[int(rng.integers(len(NAMES)))]
        emotion = EMOTIONS[int(rng.integers(len(EMOTIONS)))]
        fill = {"name": name, "emotion": emotion, "problem": problem_t.format(name=name),
                "step": step_t.format(name=name)}
        quality = rng.normal(0, 1)  # how good this assistant is in this conversation
        n_turns = int(rng.integers(5, 21))
        messages = [Message("user", f"I'm feeling {emotion} because {fill['problem']}.")]
        turn_cues = []
        for t in range(n_turns):
            states = {}
            parts = []
            for d in dims:
                u = quality + rng.normal(0, 1)
                state = 1 if u > 0.5 else (-1 if u < -1.0 else 0)
                if d == "continuity" and t == 0:
                    state = 0  # nothing earlier to refer to
                states[d] = state
                if state:
                    options = CUES[d][state] if d in CUES else []
                    if options:
                        parts.append(options[int(rng.integers(len(options)))].format(**fill))
            # Keep the question last so curiosity reads naturally.
            parts.sort(key=lambda p: p.endswith("?"))
            messages.append(Message("assistant", " ".join(parts) if parts else "I see."))
            turn_cues.append(states)
            if t < n_turns - 1:
                follow = FOLLOW_UPS[int(rng.integers(len(FOLLOW_UPS)))]
                text = follow.format(weeks=int(rng.integers(2, 9)), echo=echo_t.format(name=name), emotion=emotion)
                messages.append(Message("user", text))
        turn_indices = [i for i, m in enumerate(messages) if m.role == "assistant"]
        owners = [rater_ids[int(rng.integers(n_raters))]]
        while len(owners) < raters_per_conversation:
            extra = rater_ids[int(rng.integers(n_raters))]
            if extra not in owners:
                owners.append(extra)
        whole = rng.random() < whole_conversation_share
        for rid in owners:
            context = {}
            for key, fld in ctx_fields.items():
                context[key] = (fld.choices[int(rng.integers(len(fld.choices)))] if fld.type == "choice"
                                else int(rng.integers(fld.min, fld.max + 1)))
            conversations.append(Conversation(conv_id, rid, list(messages), context))
            wanted = float(context.get("empathy_wanted", 3))
            mood = float(context.get("emotional_state", 3))
            s = sens[rid]
            # Cues of dimensions a study's taxonomy leaves out still shape the text; read them as neutral.
            failures = [1.0 if st.get("continuity", 0) == -1 else 0.0 for st in turn_cues]
            unmet = [1.0 if ((wanted >= 4 and st.get("acknowledgement", 0) < 1 and st.get("validation", 0) < 1)
                             or st.get("tone", 0) == -1) else 0.0 for st in turn_cues]
            overall_means, population_overall = [], []
            for t, (turn_index, st) in enumerate(zip(turn_indices, turn_cues)):
                # The average rater's mean (no random draws here: the data are unchanged by it).
                failed = sum(w * failures[t - k] for k, w in enumerate(FAILURE_PENALTY) if t - k >= 0)
                average_penalty = failed + sum(w * unmet[t - k] for k, w in enumerate(UNMET_PENALTY) if t - k >= 0)
                average = {}
                for d in dims:
                    q = CUE_WEIGHT * st[d] * ((1 + 0.15 * (wanted - 3)) if d in ("acknowledgement", "validation") else 1)
                    average[d] = base + q + 0.1 * (mood - 3) - average_penalty
                average[taxonomy.overall.key] = base + 0.1 * (mood - 3) - average_penalty + 0.8 * float(np.mean(
                    [average[d] - base - 0.1 * (mood - 3) + average_penalty for d in dims])) * 2.5
                population_overall.append(average[taxonomy.overall.key])
                population_rows.append({"conversation_id": conv_id, "turn_index": turn_index, "rater_id": rid,
                                        **average})
                penalty = s["_failure"] * sum(w * failures[t - k] for k, w in enumerate(FAILURE_PENALTY) if t - k >= 0)
                penalty += sum(w * unmet[t - k] for k, w in enumerate(UNMET_PENALTY) if t - k >= 0)
                means = {}
                weighted = []
                for j, d in enumerate(dims):
                    q = CUE_WEIGHT * st[d]
                    if d in ("acknowledgement", "validation"):
                        q *= 1 + 0.15 * (wanted - 3)
                    weighted.append(s[d] * q)
                    means[d] = base + leniency[rid] + s["_offsets"][j] + s[d] * q + 0.1 * (mood - 3) - penalty
                j = len(dims)
                means[taxonomy.overall.key] = (base + leniency[rid] + s["_offsets"][j] + 0.1 * (mood - 3) - penalty
                                               + s[taxonomy.overall.key] * 0.8 * float(np.mean(weighted)) * 2.5)
                overall_means.append(means[taxonomy.overall.key])
                latent_rows.append({"conversation_id": conv_id, "turn_index": turn_index, "rater_id": rid, **means})
                for c in controls:
                    rating = 1 + int(np.searchsorted(thresholds, means[c] + rng.normal(0, NOISE_SD)))
                    rating_rows.append((conv_id, turn_index, rid, c, rating))
                expected = 1 if unmet[t] else (3 if np.mean([st[d] for d in dims]) > 0.2 else 2)
                rating_rows.append((conv_id, turn_index, rid, taxonomy.expectation_key, expected))
                if rid == owners[0]:
                    cue_rows.append({"conversation_id": conv_id, "turn_index": turn_index, **st})
            if whole:
                mean = float(np.mean(overall_means))
                latent_rows.append({"conversation_id": conv_id, "turn_index": pd.NA, "rater_id": rid,
                                    taxonomy.overall.key: mean})
                population_rows.append({"conversation_id": conv_id, "turn_index": pd.NA, "rater_id": rid,
                                        taxonomy.overall.key: float(np.mean(population_overall))})
                rating = 1 + int(np.searchsorted(thresholds, mean + rng.normal(0, NOISE_SD)))
                rating_rows.append((conv_id, pd.NA, rid, taxonomy.overall.key, rating))

    ratings = pd.DataFrame(rating_rows, columns=["conversation_id", "turn_index", "rater_id", "dimension", "rating"])
    ratings["turn_index"] = ratings["turn_index"].astype("Int64")
    latent = pd.DataFrame(latent_rows)
    latent["turn_index"] = latent["turn_index"].astype("Int64")
    sensitivity = pd.DataFrame({rid: {c: s[c] for c in controls} for rid, s in sens.items()}).T
    population = pd.DataFrame(population_rows)
    population["turn_index"] = population["turn_index"].astype("Int64")
    truth = SynthTruth(thresholds=thresholds, noise_sd=NOISE_SD, latent=latent,
                       leniency=pd.Series(leniency), trait_leniency=pd.Series(trait_len),
                       sensitivity=sensitivity, cues=pd.DataFrame(cue_rows), population_latent=population)
    return SynthData(conversations, raters, ratings, truth, taxonomy)


def write(synth: SynthData, out_dir) -> dict[str, Path]:
    """Write conversations.jsonl, raters.csv, ratings.csv (byte-identical for the same SynthData).

    Several raters per conversation: conversations.jsonl keeps one line per conversation (its owner's, with
    the owner's context: a conversation id appears once) and assignments.csv (conversation_id, rater_id)
    gives it to the other raters, as `sense7 import --assignments` and `sense7 evaluate --assignments` read.
    (The other raters' own contexts, which the planted ratings used, are not in the files.)"""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ("conversations.jsonl", "raters.csv", "ratings.csv")}
    owners, extra = set(), []
    with open(paths["conversations.jsonl"], "w", encoding="utf-8", newline="\n") as fh:
        for conv in synth.conversations:
            if conv.conversation_id in owners:
                extra.append((conv.conversation_id, conv.rater_id))
                continue
            owners.add(conv.conversation_id)
            fh.write(json.dumps(conv.to_json(), ensure_ascii=False) + "\n")
    if extra:
        paths["assignments.csv"] = out / "assignments.csv"
        with open(paths["assignments.csv"], "w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(["conversation_id", "rater_id"])
            writer.writerows(spreadsheet_rows(extra))
    with open(paths["raters.csv"], "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(list(synth.raters.columns))
        writer.writerows(spreadsheet_rows(["" if pd.isna(v) else v for v in row]
                                          for row in synth.raters.itertuples(index=False)))
    with open(paths["ratings.csv"], "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(list(synth.ratings.columns))
        writer.writerows(spreadsheet_rows(["" if pd.isna(v) else v for v in row]
                                          for row in synth.ratings.itertuples(index=False)))
    return paths
