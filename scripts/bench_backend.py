"""Load test of the ML backend: gunicorn + the full personalized model, wrk with 16 connections.

    .venv/bin/python scripts/bench_backend.py                 # batches of 1 and 10, 30 s each
    .venv/bin/python scripts/bench_backend.py --duration 10 --batches 10 --workers 2 --threads 4   # gthread
    .venv/bin/python scripts/bench_backend.py --half-open 50   # each batch idle, then under 50 half-open connections

Trains a real bundle (sense7.model.bundle.train_bundle) on synthetic data (sense7.data.synth), promotes it in a
temporary registry, fills a temporary store with the raters' traits and contexts, starts the backend with
`sense7 backend start`'s code path on a free port, and drives POST /predict with wrk (C, so the load
generator is not the bottleneck; `apt-get install wrk`). Each request body is one of 64 different task
batches (a Lua script rotates them), tasks of known, traits-only and unknown raters mixed. A request
counts as an error if it is not 2xx; before each run one request is checked for one result per task,
eight ratings each and no per-task error.

--half-open N (issue 23): after each batch's run, N connections without credentials that send part of a
request's headers and then nothing are held open (reopened whenever the server closes one), and the same
run is measured again: the row "+N half-open" and the p99 ratio to the idle run (goal: within 2x).
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from benchkit import argument_parser

LUA = r"""
local bodies = {}
local n = 0
local f = io.open("%(bodies)s", "r")
for line in f:lines() do n = n + 1; bodies[n] = line end
f:close()
local i = 0
request = function()
  i = (i %% n) + 1
  return wrk.format("POST", "/predict", {["Content-Type"] = "application/json",
                                         ["Authorization"] = "%(auth)s"}, bodies[i])
end
"""


def prepare(home: Path, n_conversations: int, n_raters: int, seed: int):
    from sense7.data import synth
    from sense7.data.store import Store
    from sense7.labelstudio.importer import plan_tasks
    from sense7.model.bundle import train_bundle
    from sense7.model.registry import ModelRegistry
    from sense7.processes import free_port
    from sense7.settings import Settings
    from sense7.taxonomy import load_taxonomy

    settings = Settings.from_env({"SENSE7_HOME": str(home), "SENSE7_BACKEND_USER": "bench",
                                  "SENSE7_BACKEND_PASSWORD": "bench-pass", "SENSE7_BACKEND_PORT": str(free_port())})
    data = synth.generate(n_conversations, n_raters, seed, load_taxonomy(), raters_per_conversation=2)
    started = time.perf_counter()
    bundle = train_bundle(data.rating_data(), "v1", data.taxonomy)
    print(f"trained bundle v1 on {len(data.ratings)} ratings in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    registry = ModelRegistry(settings.model_dir)
    registry.add(bundle, "v1")
    registry.promote("v1")
    store = Store(settings.store_url)
    raters = data.raters.drop(columns=["email"], errors="ignore").set_index("rater_id")
    # Leave a quarter of the raters without traits, so generic predictions are in the mix too.
    with_traits = list(raters.index)[: int(len(raters) * 0.75)]
    store_traits = [{k: (v.item() if hasattr(v, "item") else v) for k, v in raters.loc[r].items() if v == v}
                    for r in with_traits]
    store.upsert_raters([{"rater_id": r, "traits": t} for r, t in zip(with_traits, store_traits)])
    store.upsert_conversations(data.conversations)
    tasks = plan_tasks(data.conversations)
    # The same turns as seen by people without ratings: newcomers with a profile (the "traits" model)
    # and strangers the store does not know (the "generic" model).
    newcomers = [{"rater_id": f"newcomer{i}", "traits": store_traits[i % len(store_traits)]} for i in range(7)]
    store.upsert_raters(newcomers)
    strangers = []
    for i, t in enumerate(tasks[: len(tasks) // 5]):
        who = f"newcomer{i % 7}" if i % 2 else f"stranger{i % 7}"
        strangers.append({"data": dict(t["data"], rater_id=who)})
    tasks = tasks + strangers
    for i, t in enumerate(tasks, start=1):
        t["id"] = i
        t["project"] = 1
    return settings, tasks


def write_bodies(path: Path, tasks: list[dict], batch: int, label_config: str, count: int = 64) -> list[str]:
    rng = random.Random(batch)
    lines = []
    for _ in range(count):
        chosen = rng.sample(tasks, batch)
        lines.append(json.dumps({"tasks": chosen, "project": "1.1700000000", "label_config": label_config,
                                 "params": {"login": None, "password": None, "context": None}}))
    path.write_text("\n".join(lines) + "\n")
    return lines


def worker_cpu_seconds(master_pid: int) -> dict[int, float]:
    """CPU seconds (user + system) used so far by each gunicorn worker, the master's children."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master_pid:  # fields[1] is the parent pid; utime, stime are fields 11, 12
            seconds[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def parse_wrk(text: str) -> dict:
    def unit(value: str) -> float:
        number, suffix = re.match(r"([\d.]+)(\w+)", value).groups()
        return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[suffix]

    pct = {m.group(1): unit(m.group(2)) for m in re.finditer(r"^\s+(\d+)%\s+(\S+)", text, re.M)}
    requests_total = int(re.search(r"(\d+) requests in", text).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return {
        "p50_ms": pct.get("50"), "p90_ms": pct.get("90"), "p99_ms": pct.get("99"),
        "requests": requests_total,
        "req_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),
        "errors": (int(non2xx.group(1)) if non2xx else 0) + (sum(map(int, socket.groups())) if socket else 0),
    }


class HalfOpenClients:
    """N connections that send a partial request and then nothing, each reopened when the server closes it."""

    def __init__(self, host: str, port: int, n: int):
        self.host, self.port, self.n = host, port, n
        self.stopped = threading.Event()
        self.reopened = 0
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _open(self):
        import socket

        sock = socket.create_connection((self.host, self.port), timeout=5)
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n")
        sock.setblocking(False)
        return sock

    def _hold(self):
        socks = [self._open() for _ in range(self.n)]
        while not self.stopped.wait(0.2):
            for i, sock in enumerate(socks):
                try:
                    closed = sock.recv(1024) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if closed:
                    sock.close()
                    socks[i] = self._open()
                    self.reopened += 1
        for sock in socks:
            sock.close()

    def __enter__(self):
        self.thread.start()
        time.sleep(1.0)  # every connection is open before the measured run
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join()


def main() -> int:
    parser = argument_parser(__doc__, out=False, full_help=True)
    parser.add_argument("--duration", type=int, default=30)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="1: gevent workers (the default)")
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--raters", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the temporary SENSE7_HOME")
    parser.add_argument("--half-open", type=int, default=0, metavar="N",
                        help="measure each batch again under N half-open connections (issue 23)")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        print("wrk not found: apt-get install -y wrk", file=sys.stderr)
        return 2

    from sense7.stack import Stack
    from sense7.taxonomy import load_taxonomy, render_rating_config

    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    home = Path(tempfile.mkdtemp(prefix="sense7-bench-"))
    settings, tasks = prepare(home, args.conversations, args.raters, args.seed)
    label_config = render_rating_config(load_taxonomy())
    auth = "Basic " + base64.b64encode(b"bench:bench-pass").decode()
    rows = []
    with Stack(settings) as stack:
        stack.start_backend(workers=args.workers, threads=args.threads)
        server = stack.backend
        for batch in args.batches:
            bodies_path = home / f"bodies-{batch}.jsonl"
            bodies = write_bodies(bodies_path, tasks, batch, label_config)
            check = requests.post(f"{server.url}/predict", data=bodies[0], timeout=30,
                                  headers={"Content-Type": "application/json", "Authorization": auth}).json()
            results = check["results"]
            assert len(results) == batch, results
            assert all("error" not in r and len(r["result"]) == 8 and r["model_version"] == "v1" for r in results), \
                results
            kinds = sorted({r["kind"] for line in bodies[:16] for r in requests.post(
                f"{server.url}/predict", data=line, headers={"Content-Type": "application/json",
                                                             "Authorization": auth}).json()["results"]})
            script = home / f"bench-{batch}.lua"
            script.write_text(LUA % {"bodies": bodies_path, "auth": auth})
            # warm-up: every worker has loaded its model and its caches before the measured run
            subprocess.run(["wrk", "-t2", f"-c{args.connections}", "-d3s", "-s", str(script), server.url],
                           check=True, capture_output=True)

            def measured(label):
                cpu_before = worker_cpu_seconds(server.pid())
                out = subprocess.run(["wrk", "-t2", f"-c{args.connections}", f"-d{args.duration}s", "--latency",
                                      "-s", str(script), server.url], check=True, capture_output=True,
                                     text=True).stdout
                cpu = worker_cpu_seconds(server.pid())
                # How the load spread over the workers: a worker that accepted most keep-alive connections
                # does most of the work while the other idles (see docs/BENCHMARKS.md).
                used = sorted((cpu[pid] - cpu_before.get(pid, 0.0) for pid in cpu), reverse=True)
                stats = parse_wrk(out)
                stats.update(batch=label, tasks_per_s=stats["req_per_s"] * batch, kinds=kinds,
                             worker_cpu="/".join(f"{s:.0f}" for s in used))
                rows.append(stats)
                print(out, file=sys.stderr)
                return stats

            idle = measured(batch)
            if args.half_open:
                host, port = server.url.rsplit("/", 1)[1].split(":")
                with HalfOpenClients(host, int(port), args.half_open) as held:
                    loaded = measured(f"{batch} +{args.half_open} half-open")
                loaded["batch"] += f" (p99 {loaded['p99_ms'] / idle['p99_ms']:.2f}x idle, {held.reopened} reopened)"
    if not args.keep:
        shutil.rmtree(home, ignore_errors=True)
    kind = "gevent" if args.threads == 1 else "gthread"
    print(f"gunicorn {args.workers} workers x {args.threads} threads ({kind}), wrk -t2 -c{args.connections} "
          f"-d{args.duration}s, {os.cpu_count()} cores, load average before/after: {load_before} / "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| batch | requests/s | tasks/s | p50 ms | p90 ms | p99 ms | errors | worker CPU s | kinds served |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['batch']} | {r['req_per_s']:.0f} | {r['tasks_per_s']:.0f} | {r['p50_ms']:.1f} | "
              f"{r['p90_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} | {r['worker_cpu']} | {', '.join(r['kinds'])} |")
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
