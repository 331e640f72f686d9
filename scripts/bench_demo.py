"""Run `sense7 demo` (any size) in a fresh SENSE7_HOME and measure what a study's machine must hold: each
phase's wall time, the peak resident memory (RSS, whole process tree, sampled every 0.5 s) of Label Studio,
the ML backend and the Celery worker, and the retrains the run made (training items, seconds).

    .venv/bin/python scripts/bench_demo.py [--out f.json] -- --n-conversations 1400 --n-raters 109 --seed 3

Arguments after `--` go to `sense7 demo`. Prints one JSON document (also written to --out); stops the
stack (`sense7 down`) at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchkit import argument_parser, emit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sense7.processes import tree_rss  # noqa: E402

SERVICES = {"label-studio": "Label Studio", "ml-backend": "ML backend", "celery-worker": "Celery worker",
            "rater-page": "rater page"}


class RssSampler(threading.Thread):
    def __init__(self, run_dir: Path, interval: float = 0.5):
        super().__init__(daemon=True)
        self.run_dir, self.interval = run_dir, interval
        self.peak = {name: 0 for name in SERVICES}
        self.running = True

    def run(self) -> None:
        while self.running:
            for name in SERVICES:
                try:
                    pid = int((self.run_dir / f"{name}.pid").read_text().strip())
                except (OSError, ValueError):
                    continue
                self.peak[name] = max(self.peak[name], tree_rss(pid))
            time.sleep(self.interval)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("demo_args", nargs="*", help="arguments for `sense7 demo` (after --)")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="bench-demo-"))
    env = {**os.environ, "SENSE7_HOME": str(home)}
    for name in ("SENSE7_REDIS_URL", "SENSE7_STORE_URL", "SENSE7_MODEL_DIR"):
        env.pop(name, None)
    sense7 = str(Path(sys.executable).parent / "sense7")
    sampler = RssSampler(home / "run")
    sampler.start()
    started = time.perf_counter()
    try:
        done = subprocess.run([sense7, "demo", *args.demo_args], env=env, cwd=REPO)
    finally:
        wall = time.perf_counter() - started
        sampler.running = False
    figures = {"command": f"sense7 demo {' '.join(args.demo_args)}".strip(), "exit_code": done.returncode,
               "wall_s": round(wall, 1), "machine": f"{os.cpu_count()} cores",
               "peak_rss_mib": {SERVICES[k]: round(v / 2**20) for k, v in sampler.peak.items()}}
    timings = home / "demo-timings.md"
    if timings.exists():
        figures["phases"] = timings.read_text()
    retrains = []
    for metrics in sorted((home / "models").glob("*/metrics.json")):
        m = json.loads(metrics.read_text())
        retrains.append({"version": metrics.parent.name, "reason": m.get("reason"),
                         "train_items": m.get("n_train_items"), "train_seconds": m.get("train_seconds"),
                         "promoted": m.get("promoted")})
    figures["retrains"] = retrains
    subprocess.run([sense7, "down"], env=env, cwd=REPO, capture_output=True)
    emit(figures, args.out)
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
