"""Live pre-fills on planted data: the gain curve of new raters' live predictions (sense7.research.live_gain).

    .venv/bin/python scripts/bench_live.py                      # seed 0 (the test's), 500 resamples
    .venv/bin/python scripts/bench_live.py --seeds 0 1 2 3 --json live.json
    .venv/bin/python scripts/bench_live.py --latency           # for the lead, on a quiet machine only

--latency times what a live pre-fill adds to a rater page (sense7.rater_page.live_prefills.LivePrefills.prefill on a
SQLite store: read the record, the rater's queue answers, contexts and traits, update the posterior from
10 / 50 / 200 answers, predict, record) and prints p50 / p99 per answer count.

A synthetic study (sense7.synthetic.synth) whose ratings are redrawn with strong rater leniency (sd 0.8 on the
latent scale, cut points 1 apart) and slopes (1 + N(0, 0.5)); a version is trained on 36 of 60 raters; each
of the 24 new raters (6 of them answering at random) answers their turns in order, each next turn
predicted live from their answers so far (population parameters fixed). Quality only: no timings.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sense7.research.live_gain import simulate  # noqa: E402
from sense7.taxonomy import load_taxonomy  # noqa: E402


def _fmt(block: dict) -> str:
    value, (low, high) = block["value"], block["ci"]
    return f"{value:.3f} [{low:.3f}, {high:.3f}]" if value is not None and low is not None else "-"


def latency(repeats: int = 200) -> None:
    """p50 / p99 of LivePrefills.prefill for a rater with n answers (a fresh turn each call)."""
    import tempfile
    import time

    import numpy as np

    from sense7.store.rater_page_tables import QueueItem
    from sense7.store.database import Store
    from sense7.synthetic.synth import generate
    from sense7.labelstudio.protocol import rating_tasks
    from sense7.model.bundle import train_bundle
    from sense7.model.registry import ModelRegistry
    from sense7.rater_page.live_prefills import LivePrefills

    tax = load_taxonomy()
    synth = generate(400, 40, seed=0, taxonomy=tax)
    registry_dir = Path(tempfile.mkdtemp())
    store = Store(f"sqlite:///{registry_dir / 'store.sqlite'}")
    registry = ModelRegistry(registry_dir / "models", store)
    registry.promote(registry.add(train_bundle(synth.rating_data(), "v1", tax), "v1").name)
    convs = [c for c in synth.conversations]
    for conv in convs:
        conv.rater_id = "bench"
    store.upsert_conversations(convs)
    datas = [t["data"] for c in convs for t in rating_tasks(c)][:200 + 3 * repeats]
    live = LivePrefills(registry, store, tax)
    live.refresh()  # what the page's background thread has done before a request (never a request's cost)
    rng = np.random.default_rng(0)
    for round_, n in enumerate((10, 50, 200)):
        items = [QueueItem(100 + i, "rating", i, d["conversation_id"], d["turn_index"],
                           {"history": d["history"], "turn": d["turn"]}, None,
                           {"values": {c: int(rng.integers(1, 6)) for c in tax.controls}} if i < n else None)
                 for i, d in enumerate(datas)]
        times = []
        # Fresh turns each round: a turn already recorded is answered from its record (cheaper).
        for item in items[200 + round_ * repeats:200 + (round_ + 1) * repeats]:
            started = time.perf_counter()
            live.prefill("bench", items, item)
            times.append(time.perf_counter() - started)
        print(f"{n:>3} answers: p50 {1000 * np.percentile(times, 50):.1f} ms, p99 {1000 * np.percentile(times, 99):.1f} ms "
              f"({repeats} pre-fills)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--raters", type=int, default=60)
    parser.add_argument("--new", type=int, default=24)
    parser.add_argument("--random", type=int, default=6)
    parser.add_argument("--after", type=int, default=5)
    parser.add_argument("--boot", type=int, default=500)
    parser.add_argument("--json", type=Path, help="write every seed's result here")
    parser.add_argument("--latency", action="store_true", help="time a live pre-fill instead (quiet machine only)")
    args = parser.parse_args()
    if args.latency:
        latency()
        return
    results = []
    for seed in args.seeds:
        result = simulate(args.conversations, args.raters, args.new, args.random, seed=seed, after=args.after,
                          n_boot=args.boot, taxonomy=load_taxonomy())
        results.append(result)
        signal, noise = result["after"]["signal"], result["after"]["random"]
        print(f"seed {seed}: after {args.after} answers, {signal['n_raters']} raters with signal: MAE live "
              f"{_fmt(signal['live'])}, traits prior {_fmt(signal['static'])}, generic {_fmt(signal['generic'])}; "
              f"relative gain {_fmt(signal['relative_gain'])}")
        if noise:
            print(f"         {noise['n_raters']} random raters: live - prior {_fmt(noise['live_minus_static'])}")
        print("  own earlier ratings | ratings | MAE live | MAE static | MAE generic | gain (1 - live/static)")
        for b in result["curve"]["bins"]:
            print(f"  {b['own_ratings']:>19} | {b['n']:>7} | {_fmt(b['mae']['live'])} | {_fmt(b['mae']['static'])} | "
                  f"{_fmt(b['mae']['generic'])} | {_fmt(b['relative_gain'])}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
