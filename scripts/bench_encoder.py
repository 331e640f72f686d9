"""Speed of a text encoder on a synthetic study's texts (issue 39 item 2: a default encoder needs >= 1,000
texts/s on 2 cores), and what it costs to start.

    .venv/bin/python scripts/bench_encoder.py                       # the static encoder
    .venv/bin/python scripts/bench_encoder.py --encoder ngrams --json enc.json

Texts: the rated turns and the histories of `build_items(generate(1000, 100, seed 1))` (the synthetic study
the model benchmarks use). Figures, each the median of --repeats runs:
- import_s, first_load_s: in a fresh Python process, importing sense7's model modules; then making the
  encoder, fitting it and encoding one text (the static encoder hashes its weights and reads its table file:
  build it first with `sense7 models encoder`);
- turns_first_per_s: every distinct turn once, in a process that has seen none of their words;
- turns_known_per_s: the same texts again (an encoder may keep what it learned of their words);
- histories_per_s: the distinct histories (long texts);
- batch1_per_s / batch10_per_s: turns one at a time and ten at a time, as the ML backend's requests come.
The machine's load is recorded beside: run it under `flock /tmp/bench.lock` and say busy or quiet.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchkit import argument_parser, emit  # noqa: E402

FIRST_LOAD = """
import time; t0 = time.perf_counter()
from sense7.model.features import text_encoder_named
from sense7.model.text import BulkNgramVectorizer
t1 = time.perf_counter()
encoder = (text_encoder_named({name!r}) or BulkNgramVectorizer(min_df=1)).fit(["warm up"])
encoder.transform(["I am sorry to hear that."])
print(t1 - t0, time.perf_counter() - t1)
"""


def study_texts(seed: int = 1) -> tuple[list[str], list[str]]:
    """The distinct rated turns and histories of the model benchmarks' synthetic study."""
    from sense7.data.items import build_items
    from sense7.synthetic.synth import generate
    from sense7.taxonomy import load_taxonomy

    tax = load_taxonomy()
    X, _ = build_items(generate(1000, 100, seed, tax).rating_data(), tax)
    turns = list(dict.fromkeys(X["text"].astype(str)))
    histories = list(dict.fromkeys(t for t in X["history_text"].astype(str) if t))
    return turns, histories


def rate(encode, texts: list[str], batch: int | None = None) -> float:
    """Texts per second through `encode`, in batches of `batch` (None: all at once)."""
    start = time.perf_counter()
    if batch is None:
        encode(texts)
    else:
        for i in range(0, len(texts), batch):
            encode(texts[i:i + batch])
    return len(texts) / (time.perf_counter() - start)


def first_load(name: str) -> tuple[float, float]:
    """(seconds to import sense7's model modules, seconds to make, fit and first use the encoder) in a fresh process."""
    out = subprocess.run([sys.executable, "-c", FIRST_LOAD.format(name=name)], check=True, capture_output=True,
                         text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    imported, loaded = out.stdout.strip().splitlines()[-1].split()
    return float(imported), float(loaded)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--encoder", default="static", help="a name `--text-encoder` takes (static, minilm, ngrams)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-texts", type=int, default=2000, help="turns sent one and ten at a time")
    args = parser.parse_args()

    from sense7.model.features import text_encoder_named
    from sense7.model.text import BulkNgramVectorizer

    turns, histories = study_texts()
    figures = {"encoder": args.encoder, "distinct_turns": len(turns), "distinct_histories": len(histories),
               "turn_chars_mean": round(statistics.mean(map(len, turns)), 1),
               "history_chars_mean": round(statistics.mean(map(len, histories)), 1),
               "load_before": os.getloadavg()[0]}
    loads = [first_load(args.encoder) for _ in range(args.repeats)]
    figures["import_s"] = round(statistics.median(imported for imported, _ in loads), 3)
    figures["first_load_s"] = round(statistics.median(loaded for _, loaded in loads), 3)
    runs = {"turns_first_per_s": [], "turns_known_per_s": [], "histories_per_s": [], "batch1_per_s": [],
            "batch10_per_s": []}
    few = turns[:args.batch_texts]
    for _ in range(args.repeats):
        # A fresh encoder each repeat; the static encoder's memory of chunks is per process, so "first" is
        # first only in the first repeat: its median over repeats is reported as known, its first run as first.
        encoder = (text_encoder_named(args.encoder) or BulkNgramVectorizer()).fit(turns)
        runs["turns_first_per_s"].append(rate(encoder.transform, turns))
        runs["turns_known_per_s"].append(rate(encoder.transform, turns))
        runs["histories_per_s"].append(rate(encoder.transform, histories))
        runs["batch1_per_s"].append(rate(encoder.transform, few, 1))
        runs["batch10_per_s"].append(rate(encoder.transform, few, 10))
    figures["turns_first_per_s"] = round(runs.pop("turns_first_per_s")[0])
    figures.update({key: round(statistics.median(values)) for key, values in runs.items()})
    figures["load_after"] = os.getloadavg()[0]
    emit(figures, args.out)


if __name__ == "__main__":
    main()
