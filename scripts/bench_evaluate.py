"""Benchmark `sense7 evaluate` / `sense7 analyze`: WASSA 2024 figures (when the data is present) and the
harness's own speed on synthetic data.

    .venv/bin/python scripts/bench_evaluate.py                       # WASSA (if present) + synthetic timing
    .venv/bin/python scripts/bench_evaluate.py --wassa DIR --out OUT # JSON and HTML report into OUT
    .venv/bin/python scripts/bench_evaluate.py --planted 300x40     # also all models on synthetic data
    .venv/bin/python scripts/bench_evaluate.py --data convabuse --variants relational_weight=0,0.3
                                                                     # one estimator parameter, compared
    .venv/bin/python scripts/bench_evaluate.py --variants relational_weight=0,0.3 --with text_encoder=minilm
                                                                     # ... with fixed parameters for all
A parameter value `minilm` is the sentence-embedding encoder (the [embeddings] extra), `static@384@1e-3` the
static encoder with 384 dimensions and SIF coefficient 1e-3 (its own table, distilled on first use),
`static@lines` / `static@lines:0.7` the static encoder pooling each line alone (equal weights / recent lines
weighted up), `none` is None;
`text_encoder=static` (its default table and pooling) and `text_encoder=ngrams` name the models' own choices
(the models' default is n-grams alone).

Prints Markdown tables ready for docs/BENCHMARKS.md. The WASSA files are research-only and never part of
the repository or the tests; without them the WASSA part is skipped.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sense7.model.catalog import CATALOG
from sense7.research.evaluation import evaluate, evaluate_items

from benchkit import argument_parser

DEFAULT_WASSA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wassa2024"


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def markdown(result: dict) -> str:
    lines = []
    for split, body in result["splits"].items():
        lines.append(f"\n{split} ({body['n_folds']} folds by {body['cluster']}):\n")
        lines.append("| model | Spearman [95% CI] | accuracy | QWK | MAE |")
        lines.append("| --- | --- | --- | --- | --- |")
        for name in CATALOG.order(body["models"]):
            o = body["models"][name]["overall"]
            ci = o["spearman_ci"]
            ci_text = "" if ci[0] is None else f" [{ci[0]:.3f}, {ci[1]:.3f}]"
            lines.append(f"| {name} | {_fmt(o['spearman'])}{ci_text} | {_fmt(o['accuracy'])} | {_fmt(o['qwk'])} "
                         f"| {_fmt(o['mae'])} |")
        paired = body["paired"].get("personalized_minus_generic")
        if paired and paired["spearman"] is not None:
            lines.append(f"\npersonalized - generic Spearman: {paired['spearman']:+.3f} "
                         f"[{paired['ci'][0]:+.3f}, {paired['ci'][1]:+.3f}] (paired cluster bootstrap)")
    return "\n".join(lines)


def bench_wassa(directory: Path, out: Path | None, folds: int, boot: int, seed: int) -> None:
    from sense7.readers.wassa import load_wassa
    from sense7.research.analysis import analyze
    from sense7.research.report import write_report
    from sense7.taxonomy import load_taxonomy

    t0 = time.perf_counter()
    data = load_wassa(directory)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = evaluate(data, n_folds=folds, seed=seed, n_boot=boot, dataset="wassa2024", taxonomy=load_taxonomy())
    t_eval = time.perf_counter() - t0
    t0 = time.perf_counter()
    analysis = analyze(data.ratings, n_boot=boot, seed=seed, dataset="wassa2024", taxonomy=load_taxonomy())
    t_analyze = time.perf_counter() - t0
    print(f"## WASSA 2024 ({result['n_ratings']} ratings, {result['n_raters']} raters, "
          f"{result['n_conversations']} conversations, scale {result['levels'][0]}-{result['levels'][-1]})")
    print(markdown(result))
    vc = analysis["variance_components"]
    for control, body in vc.items():
        share = body["share"]
        print(f"\nvariance shares {control}: rater {share['rater']:.1%}, conversation {share['conversation']:.1%}, "
              f"residual {share['residual']:.1%}")
    print(f"\nload {t_load:.1f} s, evaluate ({folds} folds x 2 splits x 5 models, {boot} resamples) {t_eval:.1f} s, "
          f"analyze {t_analyze:.2f} s")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "wassa_evaluate.json").write_text(json.dumps(result, indent=1))
        write_report(result, out / "wassa_report.html")
        print(f"wrote {out / 'wassa_evaluate.json'} and {out / 'wassa_report.html'}")


def bench_harness(n_conversations: int, n_raters: int, boot: int, folds: int) -> None:
    """Harness overhead alone: folds, metrics, bootstrap, gain curve. Five RaterMean variants stand in for
    the five models: near-free to fit, and (unlike constant baselines) every one has a Spearman to
    bootstrap, so this is the worst case for the resampling."""
    from sense7.data.items import build_items
    from sense7.synthetic.synth import generate
    from sense7.model.baselines import RaterMean
    from sense7.research.analysis import analyze
    from sense7.taxonomy import load_taxonomy

    tax = load_taxonomy()
    data = generate(n_conversations, n_raters, 0, tax).rating_data()
    X, Y = build_items(data, tax)
    models = {f"rater_mean_{k}": RaterMean(pseudo_count=k) for k in (0.5, 1, 2, 5, 10)}
    t0 = time.perf_counter()
    evaluate_items(X, Y, models, n_folds=folds, n_boot=boot)
    t_eval = time.perf_counter() - t0
    t0 = time.perf_counter()
    analyze(data.ratings, n_boot=boot, taxonomy=tax)
    t_analyze = time.perf_counter() - t0
    n = int(Y.notna().to_numpy().sum())
    print(f"\nharness on synthetic data: {n} ratings ({len(X)} items x {Y.shape[1]} controls), 5 models, "
          f"{folds} folds x 2 splits, {boot} resamples: evaluate {t_eval:.1f} s; analyze {t_analyze:.2f} s")


def bench_planted(n_conversations: int, n_raters: int, folds: int, boot: int, seed: int) -> None:
    """All five models on synthetic data with planted rater structure (sense7.synthetic.synth)."""
    from sense7.synthetic.synth import generate
    from sense7.taxonomy import load_taxonomy

    synth = generate(n_conversations, n_raters, seed, load_taxonomy())
    data = synth.rating_data()
    t0 = time.perf_counter()
    result = evaluate(data, n_folds=folds, seed=seed, n_boot=boot, dataset=f"synth {n_conversations}x{n_raters}",
                      taxonomy=synth.taxonomy)
    elapsed = time.perf_counter() - t0
    print(f"\n## Synthetic, planted structure ({result['n_ratings']} ratings, {result['n_items']} items, "
          f"{result['n_raters']} raters, {len(result['controls'])} controls; `generate({n_conversations}, "
          f"{n_raters}, seed={seed})`)")
    print(markdown(result))
    print(f"\nevaluate {elapsed:.1f} s")


def parse_value(v: str):
    """A command-line parameter value: booleans, numbers, `none`, `minilm` (sentence embeddings), text (so
    `text_encoder=static` is the encoder's name, which the models resolve themselves)."""
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    if v.lower() == "none":
        return None
    if v.lower() == "minilm":
        from sense7.model.embeddings import SentenceEmbeddingEncoder
        return SentenceEmbeddingEncoder()
    if v.lower().startswith("static@"):
        # static@DIMENSIONS[@SIF]: a distillation variant (its own table); an @lines[:DECAY] part anywhere:
        # per-line pooling (pooling="lines", line_decay=DECAY), e.g. static@lines, static@lines:0.7
        from sense7.model.static_embeddings import StaticEmbeddingEncoder
        parts = v.split("@")[1:]
        pooled = [p for p in parts if p.lower().startswith("lines")]
        numbers = [p for p in parts if p not in pooled]
        params = {"dimensions": int(numbers[0])} if numbers else {}
        if len(numbers) > 1:
            params["sif_coefficient"] = float(numbers[1])
        if pooled:
            params["pooling"] = "lines"
            if ":" in pooled[0]:
                params["line_decay"] = float(pooled[0].split(":", 1)[1])
        return StaticEmbeddingEncoder(**params)
    return (int(v) if v.isdigit() else float(v)) if v.replace(".", "").isdigit() else v


def parse_fixed(spec: str) -> dict:
    """`--with a=1,b=minilm` -> {"a": 1, "b": SentenceEmbeddingEncoder()}."""
    return {k: parse_value(v) for k, v in (part.split("=") for part in spec.split(",") if part)}


def _load_named(name: str, path: Path):
    if name == "wassa":
        from sense7.readers.wassa import load_wassa
        return load_wassa(path)
    from sense7.readers.convabuse import load_convabuse
    return load_convabuse(path)


def bench_variants(name: str, path: Path, spec: str, folds: int, boot: int, seed: int, fixed: str = "",
                   repeats: int = 1) -> None:
    """`--variants param=v1,v2`: generic and personalized (and rater_median) with each value of one
    estimator parameter on WASSA or ConvAbuse: Spearman, the personalization gains with CIs, LeWiDi's ANAD
    and Wasserstein (sense7.research.lewidi), one Markdown row per split and value."""
    from sense7.model.baselines import RaterMedian
    from sense7.model.estimators import GenericRater, PersonalizedRater
    from sense7.taxonomy import load_taxonomy

    param, values = spec.split("=")
    data = _load_named(name, path)

    def ci(block, digits: int = 3) -> str:
        return "n/a" if not block else \
            f"{block['mean']:.{digits}f} [{block['ci'][0]:.{digits}f}, {block['ci'][1]:.{digits}f}]"

    print(f"\n## {name}: {param} in {values}{' with ' + fixed if fixed else ''} ({folds} folds, seed {seed}, "
          f"{boot} resamples{f', within-rater gain also over {repeats} fold assignments' if repeats > 1 else ''})\n")
    print("| split | value | model | Spearman | MAE | ANAD | WS | p - g Spearman | within-rater gain |"
          + (f" over {repeats} assignments |" if repeats > 1 else ""))
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if repeats > 1 else ""))
    for value in values.split(","):
        kw = {**parse_fixed(fixed), param: parse_value(value)}
        generic_kw = {k: v for k, v in kw.items() if k in GenericRater().get_params()}  # e.g. not rater_directions
        models = {"rater_median": RaterMedian(), "generic": GenericRater(**generic_kw),
                  "personalized": PersonalizedRater(**kw)}
        result = evaluate(data, n_folds=folds, seed=seed, n_boot=boot, models=models, dataset=name,
                          taxonomy=load_taxonomy(), repeats=repeats)
        for split, body in result["splits"].items():
            paired = body["paired"].get("personalized_minus_generic") or {}
            gain = ((body["perspectivist"].get("personalization_gain") or {}).get("spearman"))
            repeated = body["perspectivist"].get("personalization_gain_repeated")
            for model in models:
                o, p = body["models"][model]["overall"], body["perspectivist"]["models"][model]
                extra = ("", "")
                if model == "personalized":
                    extra = (f"{paired['spearman']:+.3f} [{paired['ci'][0]:+.3f}, {paired['ci'][1]:+.3f}]"
                             if paired.get("spearman") is not None else "n/a", ci(gain, 4))  # often within 0.001 of 0
                spearman_mean = ((repeated or {}).get("model_spearman") or {}).get(model, {}).get("mean")
                more = "" if repeats <= 1 else (f" {ci(repeated, 4) + '; ' if model == 'personalized' else ''}"
                                                f"{'' if spearman_mean is None else f'Spearman {spearman_mean:.3f}'} |")
                print(f"| {split} | {value} | {model} | {_fmt(o['spearman'])} | {_fmt(o['mae'])} | "
                      f"{ci(p['lewidi_anad'])} | {ci(p['lewidi_wasserstein'])} | {extra[0]} | {extra[1]} |{more}",
                      flush=True)


class _OracleRater:
    """The synthetic truth (sense7.model.oracle.SynthOracle) as an estimator evaluate can cross-validate."""

    def __init__(self, truth=None, rater_blind: bool = False):
        self.truth = truth
        self.rater_blind = rater_blind

    def get_params(self, deep=True):
        return {"truth": self.truth, "rater_blind": self.rater_blind}

    def set_params(self, **params):
        self.truth = params.get("truth", self.truth)
        self.rater_blind = params.get("rater_blind", self.rater_blind)
        return self

    def fit(self, X, Y):
        import numpy as np

        self.controls_ = list(Y.columns)
        self.levels_ = np.arange(1, len(self.truth.thresholds) + 2, dtype=float)
        return self

    def predict_proba(self, X):
        from sense7.model.oracle import SynthOracle

        return SynthOracle(self.truth, rater_blind=self.rater_blind).predict_proba(X, self.controls_)

    def predict(self, X):
        import pandas as pd

        return pd.DataFrame({c: self.levels_[p.argmax(axis=1)] for c, p in self.predict_proba(X).items()},
                            index=X.index)


def bench_oracle_gain(spec: str, folds: int, boot: int, seed: int, fixed: str = "") -> None:
    """`--oracle-gain CxR`: on synthetic data with planted rater x content sensitivities (sense7.synthetic.synth),
    the within-rater Spearman gain over generic of the personalized model and of the oracle (the truth);
    and, to tell the rater-specific part from the text model's error, the rater-blind oracle (the truth for
    an average rater) against generic and the oracle against the rater-blind oracle."""
    from sense7.synthetic.synth import generate
    from sense7.model.estimators import GenericRater, PersonalizedRater
    from sense7.taxonomy import load_taxonomy

    n_conversations, n_raters = (int(v) for v in spec.split("x"))
    synth = generate(n_conversations, n_raters, seed, load_taxonomy())
    print(f"\n## Within-rater gain on synthetic data, generate({n_conversations}, {n_raters}, seed={seed}), "
          f"known raters\n")
    print("| model (as 'personalized') | Spearman | within-rater gain over generic [95% CI] | share of raters gaining |")
    print("| --- | --- | --- | --- |")
    blind = _OracleRater(synth.truth, rater_blind=True)
    kw = parse_fixed(fixed)  # --with: the personalized and generic models' parameters
    generic_kw = {k: v for k, v in kw.items() if k in GenericRater().get_params()}
    if kw:
        print(f"(personalized and generic models with {fixed}; the oracle rows are compared with that generic)\n")
    gains = {}
    for label, model, generic in (
            ("personalized", PersonalizedRater(**kw), GenericRater(**generic_kw)),
            ("personalized, rater_directions=1", PersonalizedRater(**{**kw, "rater_directions": 1}),
             GenericRater(**generic_kw)),
            ("generic with these parameters, over the default generic", GenericRater(**generic_kw), GenericRater()),
            ("oracle (the truth)", _OracleRater(synth.truth), GenericRater(**generic_kw)),
            ("rater-blind oracle (the truth for an average rater)", blind, GenericRater(**generic_kw)),
            ("oracle, over the rater-blind oracle (not generic)", _OracleRater(synth.truth), blind)):
        result = evaluate(synth.rating_data(), splits=("known_rater",), n_folds=folds, seed=seed, n_boot=boot,
                          models={"generic": generic, "personalized": model}, taxonomy=synth.taxonomy)
        body = result["splits"]["known_rater"]
        gain = body["perspectivist"]["personalization_gain"]["spearman"]
        gains[label] = gain["mean"]
        print(f"| {label} | {_fmt(body['models']['personalized']['overall']['spearman'])} | {gain['mean']:+.4f} "
              f"[{gain['ci'][0]:+.4f}, {gain['ci'][1]:+.4f}] | {gain['share_gain']:.0%} |", flush=True)
    # Two readings of "the oracle's within-rater gain": what knowing each rater's truth adds to knowing the
    # average rater's truth (the rater-specific part, what personalization can reach), and the oracle over
    # this generic model (which also counts the text model's own error).
    own = gains["personalized"]
    print(f"\npersonalized's within-rater gain {own:+.4f} = "
          f"{own / gains['oracle, over the rater-blind oracle (not generic)']:.0%} of the oracle's rater-specific gain "
          f"({gains['oracle, over the rater-blind oracle (not generic)']:+.4f}), "
          f"{own / gains['oracle (the truth)']:.0%} of the oracle's gain over generic ({gains['oracle (the truth)']:+.4f})")


def main() -> None:
    parser = argument_parser(__doc__, out=False, full_help=True)
    parser.add_argument("--wassa", type=Path, default=DEFAULT_WASSA)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--boot", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--synth", default="1000x100", help="conversations x raters for the harness timing ('' = skip)")
    parser.add_argument("--planted", default="", help="conversations x raters: all models on synthetic data")
    parser.add_argument("--variants", default="", help="param=v1,v2: generic and personalized with each value "
                                                            "of one estimator parameter (only that is run)")
    parser.add_argument("--with", dest="fixed", default="", help="a=1,b=minilm: parameters of every model of "
                                                                      "--variants and --oracle-gain")
    parser.add_argument("--data", choices=("wassa", "convabuse"), default="wassa", help="the data of --variants")
    parser.add_argument("--convabuse", type=Path, default=DEFAULT_WASSA.parent / "convabuse")
    parser.add_argument("--repeats", type=int, default=1, help="--variants: the within-rater gain also over this "
                                                                   "many fold assignments (seed, seed + 1, ...)")
    parser.add_argument("--oracle-gain", default="", help="CxR: within-rater gain of personalized vs the oracle "
                                                              "on synthetic data (only that is run)")
    args = parser.parse_args()
    if args.oracle_gain:
        bench_oracle_gain(args.oracle_gain, args.folds, args.boot, args.seed, args.fixed)
        return
    if args.variants:
        bench_variants(args.data, args.wassa if args.data == "wassa" else args.convabuse, args.variants,
                       args.folds, args.boot, args.seed, args.fixed, args.repeats)
        return
    if (args.wassa / "trac1_CONVD_train.csv").is_file():
        bench_wassa(args.wassa, args.out, args.folds, args.boot, args.seed)
    else:
        print(f"WASSA data not found in {args.wassa}: skipped")
    if args.planted:
        n_conversations, n_raters = (int(v) for v in args.planted.split("x"))
        bench_planted(n_conversations, n_raters, args.folds, args.boot, args.seed)
    if args.synth:
        n_conversations, n_raters = (int(v) for v in args.synth.split("x"))
        bench_harness(n_conversations, n_raters, args.boot, args.folds)


if __name__ == "__main__":
    main()
