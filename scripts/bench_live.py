"""Live pre-fills on planted data: the gain curve of new raters' live predictions (sense7.research.live_gain).

    .venv/bin/python scripts/bench_live.py                      # seed 0 (the test's), 500 resamples
    .venv/bin/python scripts/bench_live.py --seeds 0 1 2 3 --json live.json

A synthetic study (sense7.data.synth) whose ratings are redrawn with strong rater leniency (sd 0.8 on the
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


def _fmt(block: dict) -> str:
    value, (low, high) = block["value"], block["ci"]
    return f"{value:.3f} [{low:.3f}, {high:.3f}]" if value is not None and low is not None else "-"


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
    args = parser.parse_args()
    results = []
    for seed in args.seeds:
        result = simulate(args.conversations, args.raters, args.new, args.random, seed=seed, after=args.after,
                          n_boot=args.boot)
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
