"""Where a /predict's time goes inside one backend process: a fixed number of requests through the WSGI app.

    .venv/bin/python scripts/profile_backend.py --home /tmp/s7prof              # us per request, batch 1 and 10
    .venv/bin/python scripts/profile_backend.py --home /tmp/s7prof --cprofile   # and the top functions
    .venv/bin/python scripts/profile_backend.py --home /tmp/s7static --encoder static   # bench_backend's --encoder
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/cg.out \\
        .venv/bin/python scripts/profile_backend.py --home /tmp/s7prof --requests 200 --batches 1 --callgrind
    callgrind_annotate /tmp/cg.out | head -30       # "PROGRAM TOTALS" / 200 = instructions per request

The app is `sense7.ml_backend.app.create_app` with the real model (scripts/bench_backend.py's bundle, store
and task bodies; the home is prepared on first use and reused), called as gunicorn calls it: one WSGI
environ per request with basic auth, the body in `wsgi.input`. No sockets and no gunicorn, so the figure is
the app's own work per request, and it holds while other programs load the machine if counted in
instructions: under callgrind with --callgrind only the N measured requests are instrumented, and the
program's total / N is the instruction count of one request (the switching itself is a few 100k).
"""

from __future__ import annotations

import base64
import cProfile
import gc
import io
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

from bench_backend import prepare, write_bodies
from benchkit import argument_parser


def environ(body: bytes, auth: str) -> dict:
    from werkzeug.test import EnvironBuilder

    built = EnvironBuilder(path="/predict", method="POST", data=body, content_type="application/json",
                           headers={"Authorization": auth}).get_environ()
    built.pop("wsgi.input")
    return built


def call(app, env: dict, body: bytes) -> bytes:
    status = []
    out = b"".join(app({**env, "wsgi.input": io.BytesIO(body)}, lambda s, h, e=None: status.append(s)))
    if not status[0].startswith("200"):
        raise SystemExit(f"/predict answered {status[0]}: {out[:200]!r}")
    return out


def callgrind(switch: str, enabled: bool) -> None:
    """Count instructions only around the measured loop (the process runs under
    `valgrind --tool=callgrind --instr-atstart=no`): imports, training and warm-up are not counted."""
    if enabled:
        subprocess.run(["callgrind_control", "-i", switch, str(os.getpid())], check=True, capture_output=True)


def main() -> int:
    parser = argument_parser(__doc__, out=False, full_help=True)
    parser.add_argument("--home", type=Path, required=True, help="prepared on first use, then reused")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--encoder", choices=("ngrams", "static"), default="ngrams",
                        help="scripts/bench_backend.py's --encoder (the home remembers the one it was prepared with)")
    parser.add_argument("--cprofile", action="store_true", help="print the 25 functions with most own time")
    parser.add_argument("--callgrind", action="store_true",
                        help="under valgrind --tool=callgrind --instr-atstart=no: instrument the loop only")
    args = parser.parse_args()

    from sense7.settings import Settings

    tasks_file, encoder_file = args.home / "profile-tasks.json", args.home / "profile-encoder"
    if not tasks_file.exists():
        args.home.mkdir(parents=True, exist_ok=True)
        settings, tasks, _ = prepare(args.home, 400, 60, 7, args.encoder)
        tasks_file.write_text(json.dumps(tasks))
        encoder_file.write_text(args.encoder)
    prepared = encoder_file.read_text() if encoder_file.exists() else "ngrams"
    if prepared != args.encoder:
        raise SystemExit(f"{args.home} was prepared with --encoder {prepared}: use another --home")
    env = {"SENSE7_HOME": str(args.home), "SENSE7_BACKEND_USER": "bench", "SENSE7_BACKEND_PASSWORD": "bench-pass"}
    settings = Settings.from_env(env)
    tasks = json.loads(tasks_file.read_text())

    from sense7.ml_backend.app import create_app
    from sense7.ml_backend.model import build_model
    from sense7.taxonomy import load_taxonomy, render_rating_config

    # No timed refresh inside the loop (the registry pointer's stat, the traits table, the contexts): under
    # callgrind a loop lasts minutes, and refreshes would make the count depend on the wall clock.
    app = create_app(settings, model=build_model(settings, check_interval=1e9, refresh_seconds=1e9))
    auth = "Basic " + base64.b64encode(b"bench:bench-pass").decode()
    label_config = render_rating_config(load_taxonomy())
    for batch in args.batches:
        bodies = [b.encode() for b in write_bodies(args.home / f"profile-{batch}.jsonl", tasks, batch, label_config)]
        envs = [environ(b, auth) for b in bodies]
        for i in range(len(bodies)):  # warm: model loaded, contexts cached
            call(app, envs[i], bodies[i])
        profiler = cProfile.Profile() if args.cprofile else None
        started = time.perf_counter()
        if profiler:
            profiler.enable()
        # A full collection now, and the objects so far left out of later ones: one gen-2 collection over the
        # whole heap (model, pandas, Flask) inside a short counted loop would outweigh everything else.
        gc.collect()
        gc.freeze()
        callgrind("on", args.callgrind)
        for n in range(args.requests):
            i = n % len(bodies)
            call(app, envs[i], bodies[i])
        callgrind("off", args.callgrind)
        if profiler:
            profiler.disable()
        seconds = time.perf_counter() - started
        print(f"batch {batch}: {args.requests} requests, {seconds / max(args.requests, 1) * 1e6:.0f} us each",
              file=sys.stderr)
        if profiler:
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
