"""Rater model speed and synthetic-oracle quality.

    .venv/bin/python scripts/bench_model.py                   # speed (~100k ratings) + oracle comparison
    .venv/bin/python scripts/bench_model.py --skip-oracle     # speed only (--skip-speed: the rest only)
    .venv/bin/python scripts/bench_model.py --wassa ../shared/data/wassa2024   # + WASSA known/cold Spearman
    .venv/bin/python scripts/bench_model.py --skip-oracle --encoder minilm    # the same with sentence embeddings
    .venv/bin/python scripts/bench_model.py --skip-oracle --alpha cv          # the text penalty by inner CV
    .venv/bin/python scripts/bench_model.py --skip-oracle --rater-ridge 3     # each rater's own content weights

--encoder minilm: both models with the sentence-embedding encoder (the [embeddings] extra) and its relational
similarities (relational_weight 0.3); its line cache is emptied before every timed fit and prediction pass,
so each pass embeds what it reads as a server would (lines repeat within a pass: a history is every later
turn's history too); also the encoder alone on distinct texts (texts/s).

Speed: fit time of the generic and personalized models on a synthetic study of about 100,000 control
ratings (1,000 conversations x ~12.5 turns x 8 controls), and prediction throughput of
`ModelBundle.predict_items` (the reference path: items = (turn, rater) predictions with all 8 controls
each) and of the compiled bundle the ML backend serves (`bundle.compile()`, from plain columns), in batches.
Quality: `sense7.model.oracle.compare_with_oracle` (5-fold CV grouped by conversation, 300 conversations,
40 raters; Spearman vs observed turn ratings, controls pooled, mean over folds).
"""

from __future__ import annotations

import json
import statistics
import time

from sense7.data.items import build_items
from sense7.model import GenericRater, PersonalizedRater, options
from sense7.model.bundle import ModelBundle
from sense7.model.oracle import compare_with_oracle
from sense7.synthetic.synth import generate
from sense7.taxonomy import load_taxonomy

from benchkit import argument_parser


def _encoder_params(encoder: str) -> tuple[dict, callable]:
    """(model parameters, what empties the encoder's cache) for --encoder."""
    if encoder == "ngrams":
        return {}, lambda: None
    from sense7.model.embeddings import SentenceEmbeddingEncoder, clear_cache

    SentenceEmbeddingEncoder().fit([])  # the model loaded once (imports, weights): timed apart
    return {"text_encoder": SentenceEmbeddingEncoder(), "relational_weight": 0.3}, clear_cache


def bench_encoder_alone(texts: list[str], repeats: int) -> dict:
    """The sentence-embedding encoder on distinct texts, its cache empty: texts/s."""
    from sense7.model.embeddings import SentenceEmbeddingEncoder, clear_cache

    started = time.perf_counter()
    encoder = SentenceEmbeddingEncoder().fit([])
    load = time.perf_counter() - started
    rates = []
    for _ in range(repeats):
        clear_cache()
        started = time.perf_counter()
        encoder.transform(texts)
        rates.append(len(texts) / (time.perf_counter() - started))
    return {"encoder_load_s": round(load, 2), "encoder_distinct_texts": len(texts),
            "encoder_texts_per_s_median": round(statistics.median(rates), 1)}


def bench_speed(n_conversations: int, n_raters: int, batch: int, repeats: int, encoder: str = "ngrams",
                alpha: str | None = None, rater_ridge: str | None = None) -> dict:
    synth = generate(n_conversations, n_raters, 1, load_taxonomy())
    started = time.perf_counter()
    X, Y = build_items(synth.rating_data(), synth.taxonomy)
    items_seconds = time.perf_counter() - started
    out = {"encoder": encoder, "items": len(X), "ratings": int(Y.notna().sum().sum()),
           "build_items_s": round(items_seconds, 2)}
    params, clear = _encoder_params(encoder)
    if alpha is not None:  # --alpha: both models' text penalty (a number or cv)
        params = {**params, "alpha": options.text_alpha(alpha)}
        out["alpha"] = alpha
    if encoder != "ngrams":
        distinct = list(dict.fromkeys(X["text"].astype(str)))[:2000]
        out.update(bench_encoder_alone(distinct, repeats))
    # What train_bundle fits: the personalized model; the served generic model is its text part.
    clear()
    started = time.perf_counter()
    own_weights = {}
    if rater_ridge is not None:  # --rater-ridge: each known rater's own content weights (personalized only)
        own_weights = {"rater_ridge": options.rater_ridge(rater_ridge),
                       "rater_ridge_from": "text" if encoder == "ngrams" else "encoder"}
        out["rater_ridge"] = rater_ridge
    personalized = PersonalizedRater(**params, **own_weights).fit(X, Y)
    generic = personalized.to_generic()
    out["fit_bundle_s"] = round(time.perf_counter() - started, 2)
    clear()
    started = time.perf_counter()
    GenericRater(**params).fit(X, Y)
    out["fit_generic_alone_s"] = round(time.perf_counter() - started, 2)
    bundle = ModelBundle("bench", list(Y.columns), [1, 2, 3, 4, 5], generic, personalized,
                         frozenset(personalized.known_raters_))
    # Serving mix: known raters, plus a batch of unknown raters so the generic path runs too.
    serve = X.copy()
    serve.loc[serve.index[::10], "rater_id"] = "unknown"
    rates = []
    for _ in range(repeats):
        clear()
        started = time.perf_counter()
        for start in range(0, len(serve), batch):
            bundle.predict_items(serve.iloc[start:start + batch])
        rates.append(len(serve) / (time.perf_counter() - started))
    out.update(predict_batch=batch, predict_items_per_s_median=round(statistics.median(rates)),
               predict_items_per_s_best=round(max(rates)),
               predict_control_ratings_per_s_median=round(statistics.median(rates) * Y.shape[1]))
    # The serving path (what the ML backend runs): the compiled bundle on plain task columns.
    started = time.perf_counter()
    compiled = bundle.compile()
    traits = serve.filter(like="trait_").groupby(serve["rater_id"].astype(str)).first()
    raters = compiled.rater_table(traits)
    out["compile_s"] = round(time.perf_counter() - started, 2)
    plain = [col for col in serve.columns if not col.startswith("trait_")]
    rates = []
    for _ in range(repeats):
        clear()
        started = time.perf_counter()
        for start in range(0, len(serve), batch):
            part = serve.iloc[start:start + batch]
            compiled.predict({col: part[col].tolist() for col in plain}, raters).best()
        rates.append(len(serve) / (time.perf_counter() - started))
    out.update(compiled_items_per_s_median=round(statistics.median(rates)),
               compiled_control_ratings_per_s_median=round(statistics.median(rates) * Y.shape[1]))
    return out


def bench_wassa(directory: str) -> dict:
    from sense7.readers.wassa import load_wassa
    from sense7.model.baselines import RaterMean
    from sense7.research.evaluation import evaluate_items

    X, Y = build_items(load_wassa(directory), load_taxonomy())
    models = {"rater_mean": RaterMean(), "generic": GenericRater(), "personalized": PersonalizedRater()}
    result = evaluate_items(X, Y, models, n_folds=5, seed=0, n_boot=10)
    def rounded(value):  # None: a constant prediction (e.g. rater means of unseen raters)
        return None if value is None else round(value, 3)

    return {split: {m: rounded(v["overall"]["spearman"]) for m, v in block["models"].items()}
            for split, block in result["splits"].items()}


def main() -> None:
    parser = argument_parser(__doc__, out=False, full_help=True)
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--raters", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-oracle", action="store_true")
    parser.add_argument("--wassa", default=None, help="directory with the WASSA 2024 CSV files")
    parser.add_argument("--encoder", choices=("ngrams", "minilm"), default="ngrams",
                        help="the text encoder: n-grams (default) or sentence embeddings (the [embeddings] extra)")
    parser.add_argument("--alpha", default=None, help="the rater models' text penalty: a number or cv (default: theirs)")
    parser.add_argument("--rater-ridge", default=None,
                        help="each known rater's own content weights: a penalty or cv, cv_rater, cv_rater_1se")
    args = parser.parse_args()
    report = {}
    if not args.skip_speed:
        report["speed"] = bench_speed(args.conversations, args.raters, args.batch, args.repeats, args.encoder,
                                      args.alpha, args.rater_ridge)
        print(json.dumps(report, indent=2), flush=True)
    if not args.skip_oracle:
        report["oracle"] = {k: round(v, 3) for k, v in compare_with_oracle(generate(300, 40, 7, load_taxonomy())).items()}
        print(json.dumps({"oracle": report["oracle"]}, indent=2), flush=True)
    if args.wassa:
        report["wassa"] = bench_wassa(args.wassa)
        print(json.dumps({"wassa": report["wassa"]}, indent=2), flush=True)


if __name__ == "__main__":
    main()
