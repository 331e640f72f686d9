"""Benchmark `sense7 jury` (issue 16): a panel of 100 raters on 1,000 assistant turns, every control.

Trains a bundle on a synthetic study (`synth.generate(400, 100, seed=3)`, not timed), takes the first 1,000
assistant turns of another synthetic set of transcripts (`synth.generate(120, 100, seed=4)`, the last
conversation cut) and times, separately:

- prediction: `jury_predict` with the panel `all` (tasks, task columns, the rater table and the panel's
  probabilities: 100k rater-turn predictions x 8 controls); target <= 10 s;
- the long frame (`JuryResult.frame()`, 800k rows) and writing it as CSV (`write_csv`), and the per-turn
  summary.

    .venv/bin/python scripts/bench_jury.py [--turns 1000] [--raters 100] [--repeat 3]

Prints one JSON document. Timings are wall-clock on whatever else the machine runs.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from benchkit import argument_parser, emit


def main() -> None:
    parser = argument_parser(__doc__, out=False)
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--raters", type=int, default=100)
    parser.add_argument("--train-conversations", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3, help="prediction runs (the best and the first are shown)")
    args = parser.parse_args()

    from sense7.synthetic import synth
    from sense7.data.conversations import Conversation
    from sense7.model.bundle import train_bundle
    from sense7.research.jury import jury_predict, select_panel, write_csv
    from sense7.taxonomy import load_taxonomy

    tax = load_taxonomy()
    study = synth.generate(args.train_conversations, args.raters, 3, tax)
    started = time.perf_counter()
    bundle = train_bundle(study.rating_data(), "bench", tax)
    train_seconds = time.perf_counter() - started
    raters = study.raters.set_index("rater_id")

    transcripts, turns = [], 0
    for conv in synth.generate(max(10, args.turns // 8), args.raters, 4, tax).conversations:
        wanted = args.turns - turns
        if wanted <= 0:
            break
        assistant = conv.assistant_turns()
        if len(assistant) > wanted:  # cut the last conversation after its `wanted`-th assistant turn
            conv = Conversation(conv.conversation_id, conv.rater_id, conv.messages[:assistant[wanted - 1] + 1],
                                conv.context)
        transcripts.append(conv)
        turns += min(len(assistant), wanted)
    if turns < args.turns:
        raise SystemExit(f"only {turns} assistant turns generated")

    panel = select_panel("all", raters, sorted(bundle.known_raters), tax)[: args.raters]
    compiled = bundle.compile()  # once per model version, as the CLI and the ML backend do
    seconds = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        jury = jury_predict(compiled, transcripts, panel, raters, tax)
        seconds.append(time.perf_counter() - started)

    started = time.perf_counter()
    frame = jury.frame()
    frame_seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="bench-jury-") as tmp:
        started = time.perf_counter()
        path = write_csv(frame, Path(tmp) / "jury.csv")
        csv_seconds = time.perf_counter() - started
        csv_bytes = path.stat().st_size
    started = time.perf_counter()
    summary = jury.summary()
    summary_seconds = time.perf_counter() - started

    emit({
        "machine": f"{os.cpu_count()} cores",
        "training": f"synth.generate({args.train_conversations}, {args.raters}, seed=3), "
                    f"{bundle.metrics['n_items']} items, {train_seconds:.1f} s (not part of the jury)",
        "turns": int(len(jury.conversation_ids)),
        "conversations": len(transcripts),
        "panel": len(jury.members),
        "panel_kinds": {kind: jury.kinds.count(kind) for kind in ("personalized", "traits")},
        "controls": len(jury.controls),
        "rater_turn_predictions": int(jury.probs.shape[0] * jury.probs.shape[1]),
        "predict_seconds_first": round(seconds[0], 3),
        "predict_seconds_best": round(min(seconds), 3),
        "predict_target_seconds": 10,
        "frame_seconds": round(frame_seconds, 3),
        "frame_rows": len(frame),
        "csv_seconds": round(csv_seconds, 3),
        "csv_megabytes": round(csv_bytes / 1e6, 1),
        "summary_seconds": round(summary_seconds, 3),
        "summary_rows": len(summary),
    })


if __name__ == "__main__":
    main()
