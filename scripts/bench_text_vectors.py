"""Embed once (issue 39 item 1): the time to embed a study's texts into the store's text vectors, and what a
served request costs with a text encoder when its texts' vectors come from the cache or are computed.

    .venv/bin/python scripts/bench_text_vectors.py                      # the demo's study (80 conversations, 6 raters)
    .venv/bin/python scripts/bench_text_vectors.py --conversations 1000 --raters 100

1. Embedding: the demo's synthetic study (sense7.synthetic.synth, the demo's sizes and seed) in a fresh SQLite
   store; the embed job's work (sense7.model.vector_cache.embed_stored_conversations) with the static encoder: every
   text the encoder reads (turns, the messages they answer, history tails), timed from a loaded table; then the
   same again (every text present: look-ups only, what a retried job costs).
2. Requests: a bundle fitted with the static encoder and relational_weight="cv" (sense7.model.bundle.train_bundle),
   compiled as the backend compiles it; requests of batch 1 and 10 of the study's tasks (known raters), each
   request's items never scored before by that compiled bundle (so its per-item cache never answers), timed
   around `CompiledBundle.predict` (what /predict spends in the model):
   - computed: the encoder embeds every text of the request (no text vectors: before issue 39);
   - store: vectors read from the store's text_vectors in one query per request (a process's first sight of them);
   - memory: vectors from the process's LRU in front of the store (a text this process read before).
   Median and p99 in milliseconds per request.
The JSON document (stdout, and --out FILE) has every figure.
"""

from __future__ import annotations

import pickle
import tempfile
import time
from pathlib import Path

import numpy as np

from benchkit import argument_parser, emit, logger

from sense7.data.items import HISTORY_CHARS, task_columns
from sense7.labelstudio.importer import plan_tasks
from sense7.model.bundle import train_bundle
from sense7.model.static_embeddings import StaticEmbeddingEncoder
from sense7.model.vector_cache import VectorCache, embed_stored_conversations, with_vector_cache
from sense7.store.database import Store
from sense7.synthetic import synth
from sense7.taxonomy import load_taxonomy

log = logger("text-vectors")


def _timings(compiled, requests: list, raters) -> dict:
    seconds = []
    for columns in requests:
        started = time.perf_counter()
        compiled.predict(columns, raters)
        seconds.append(time.perf_counter() - started)
    ms = np.array(seconds) * 1000
    return {"requests": len(ms), "median_ms": round(float(np.median(ms)), 3),
            "p99_ms": round(float(np.percentile(ms, 99)), 3), "mean_ms": round(float(ms.mean()), 3)}


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--conversations", type=int, default=80, help="conversations of the synthetic study (the demo's 80)")
    parser.add_argument("--raters", type=int, default=6, help="raters of the synthetic study (the demo's 6)")
    parser.add_argument("--seed", type=int, default=7, help="the study's seed (the demo's 7)")
    parser.add_argument("--batches", default="1,10", help="tasks per request")
    args = parser.parse_args()
    tax = load_taxonomy()
    folder = Path(tempfile.mkdtemp(prefix="bench-text-vectors-"))
    study = synth.generate(args.conversations, args.raters, args.seed, taxonomy=tax)
    store = Store(f"sqlite:///{folder / 'store.sqlite'}")
    store.upsert_conversations(study.conversations)
    figures: dict = {"conversations": args.conversations, "raters": args.raters}

    started = time.perf_counter()
    encoder = StaticEmbeddingEncoder().fit([])
    encoder.transform(["a first text"])
    figures["encoder_first_load_seconds"] = round(time.perf_counter() - started, 3)
    log("embedding the study's texts")
    first = next(iter(embed_stored_conversations(store, [(encoder, HISTORY_CHARS)]).values()))
    again = next(iter(embed_stored_conversations(store, [(encoder, HISTORY_CHARS)]).values()))
    figures["embed"] = {"texts": first["texts"], "embedded": first["embedded"], "seconds": first["seconds"],
                        "texts_per_second": round(first["texts"] / max(first["seconds"], 1e-9)),
                        "again_seconds": again["seconds"], "again_embedded": again["embedded"]}
    log(f"embedded {first['texts']} texts in {first['seconds']} s; again {again['seconds']} s")

    log("training a bundle with the static encoder")
    bundle = train_bundle(study.rating_data(), "v1", tax,
                          personalized_params={"text_encoder": "static", "relational_weight": "cv"})
    blob = pickle.dumps(bundle)
    datas = [t["data"] for t in plan_tasks(study.conversations)]
    contexts = store.contexts_for((str(d["conversation_id"]), str(d["rater_id"])) for d in datas)
    traits = study.raters.drop(columns=["email"]).set_index("rater_id")
    figures["requests"] = {}
    for batch in [int(b) for b in args.batches.split(",")]:
        requests = [task_columns(datas[i:i + batch], contexts, tax) for i in range(0, len(datas) - batch + 1, batch)]
        shared = VectorCache.of_store(store)
        rows = {}
        for mode in ("computed", "store", "memory"):
            fresh = pickle.loads(blob)  # a compiled bundle whose per-item cache is empty
            if mode == "store":
                shared.forget_memory()
            if mode != "computed":
                with_vector_cache(fresh, shared, on_demand_seconds=None)
            compiled = fresh.compile()
            raters = compiled.rater_table(traits)
            rows[mode] = _timings(compiled, requests, raters)
            log(f"batch {batch} {mode}: median {rows[mode]['median_ms']} ms, p99 {rows[mode]['p99_ms']} ms")
        figures["requests"][f"batch_{batch}"] = rows
    emit(figures, args.out)


if __name__ == "__main__":
    main()
