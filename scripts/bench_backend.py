"""Load test of the ML backend: gunicorn + the full personalized model, wrk with 16 connections.

    .venv/bin/python scripts/bench_backend.py                 # batches of 1 and 10, 30 s each
    .venv/bin/python scripts/bench_backend.py --duration 10 --batches 10 --workers 2 --threads 4   # gthread
    .venv/bin/python scripts/bench_backend.py --half-open 50   # each batch idle, then under 50 half-open connections
    .venv/bin/python scripts/bench_backend.py --peer --encoder static   # a static-encoder model, vectors from the cache

Trains a real bundle (sense7.model.bundle.train_bundle) on synthetic data (sense7.synthetic.synth), promotes it in a
temporary registry, fills a temporary store with the raters' traits and contexts, starts the backend with
`sense7 backend start`'s code path on a free port, and drives POST /predict with wrk (C, so the load
generator is not the bottleneck; `apt-get install wrk`). Each request body is one of 64 different task
batches (a Lua script rotates them), tasks of known, traits-only and unknown raters mixed. A request
counts as an error if it is not 2xx; before each run one request is checked for one result per task,
eight ratings each and no per-task error.

--half-open N (issue 23): after each batch's run, N connections without credentials that send part of a
request's headers and then nothing are held open (reopened whenever the server closes one), and the same
run is measured again: the row "+N half-open" and the p99 ratio to the idle run (goal: within 2x).

--encoder static (issue 39 item 4, "vectors from the cache"): the served bundle is trained with
`text_encoder="static"` (sense7.model.static_embeddings) and its relational columns at RELATIONAL_SCALE (a
fixed weight instead of "cv" only to keep the fit short: the served columns are the same whatever weight is
chosen), and before the backend starts every text its encoder reads for the stored conversations is embedded
into the store's text vectors by the embed job's own function (sense7.model.vector_cache.
embed_stored_conversations over encoders_to_embed), so a request reads its vectors from the cache. The
check before each run also asserts that every answer says `text_vectors: embedded` (none computed on demand,
none answered by the lexical part alone). Default: ngrams (the default model, no encoder).

--peer (issue 23, "The backend got slower"): Label Studio's example ML backend is measured in the same run,
under the identical wrk load (same Lua script, bodies, connections and duration; it ignores the
Authorization header), right after sense7's runs of each batch, and the ratio sense7 / peer is reported.
What the peer is, exactly:
- the `label-studio-ml` package from PyPI (PEER_REQUIREMENTS: 1.0.9, the newest release there; the 2.x line is
  published on GitHub only) in its own virtualenv, created by this script on first use under
  --peer-venv (default ~/.cache/sense7/bench-peer-venv; outside the repository, never committed); only PyPI
  is used, and nothing is downloaded once the venv exists;
- the model is PEER_MODEL below, a minimal `LabelStudioMLBase` subclass written here (not the example
  repository's code): one scikit-learn TF-IDF vectorizer (word 1-2-grams) over the rated turn's text and one
  LogisticRegression per <Rating> control of the label config, fitted when the app is imported on the
  same synthetic data sense7's bundle is trained on (each rating of each turn a sample); a /predict
  vectorizes the tasks' turns once and returns, per task, each control's most probable level and the mean
  probability as the score, in Label Studio's result format;
- served the way `label-studio-ml init` lays it out: the package's own generator writes `_wsgi.py` around
  that script, started with its generated Dockerfile's command (`gunicorn --preload --workers 1 --threads 8
  --timeout 0 _wsgi:app`, gunicorn and rq pinned by its generated requirements.txt), bound to 127.0.0.1 on a
  free port, and `/setup` called once as Label Studio does before predicting.
The JSON document (stdout, and --out FILE) has every row, the peer's rows, and the ratios per batch.
"""

from __future__ import annotations

import base64
import contextlib
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

from benchkit import argument_parser, emit, logger

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


PEER_REQUIREMENTS = ["label-studio-ml>=1.0.9,<1.1", "scikit-learn>=1.3,<1.10"]

PEER_MODEL = r'''"""sense7's benchmark peer (scripts/bench_backend.py --peer): TF-IDF + logistic regression per Rating control."""
import json
import os

from label_studio_ml.model import LabelStudioMLBase
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression


def turn_text(data):
    return " ".join(m.get("content", "") for m in data.get("turn") or [])


with open(os.environ["PEER_TRAINING"]) as fh:
    TRAINING = json.load(fh)  # {"texts": [...], "samples": {control: [[text index, level], ...]}}
VECTORIZER = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True).fit(TRAINING["texts"])
FEATURES = VECTORIZER.transform(TRAINING["texts"])
CLASSIFIERS = {}
for control, samples in TRAINING["samples"].items():
    rows, levels = zip(*samples)
    CLASSIFIERS[control] = LogisticRegression(max_iter=300).fit(FEATURES[list(rows)], list(levels))


class PeerModel(LabelStudioMLBase):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.targets = [(name, info["to_name"][0]) for name, info in self.parsed_label_config.items()
                        if info["type"] == "Rating" and name in CLASSIFIERS]

    def predict(self, tasks, **kwargs):
        features = VECTORIZER.transform([turn_text(task["data"]) for task in tasks])
        per_control = [(name, to_name, CLASSIFIERS[name].classes_, CLASSIFIERS[name].predict_proba(features))
                       for name, to_name in self.targets]
        predictions = []
        for row in range(len(tasks)):
            result, score = [], 0.0
            for name, to_name, classes, probabilities in per_control:
                best = probabilities[row].argmax()
                result.append({"from_name": name, "to_name": to_name, "type": "rating",
                               "value": {"rating": int(classes[best])}})
                score += float(probabilities[row][best])
            predictions.append({"result": result, "score": score / max(len(result), 1)})
        return predictions
'''


def peer_training(data, tasks: list[dict]) -> dict:
    """The peer's training set: the rated turns' texts and, per control, (text index, level) of every rating."""
    index, texts = {}, []
    for task in tasks:
        d = task["data"]
        key = (str(d["conversation_id"]), int(d["turn_index"]))
        if key not in index:
            index[key] = len(texts)
            texts.append(" ".join(m.get("content", "") for m in d["turn"]))
    samples: dict[str, list] = {}
    rated = data.ratings.dropna(subset=["turn_index", "rating"])  # conversation-level ratings have no turn
    for row in rated.itertuples(index=False):
        at = index.get((str(row.conversation_id), int(row.turn_index)))
        if at is not None:
            samples.setdefault(str(row.dimension), []).append([at, int(row.rating)])
    return {"texts": texts, "samples": samples}


def peer_venv(path: Path, log) -> Path:
    """The peer's virtualenv (PEER_REQUIREMENTS, then a generated project's requirements), made on first use."""
    stamp = path / "sense7-requirements.txt"
    wanted = "\n".join(PEER_REQUIREMENTS)
    if stamp.exists() and stamp.read_text() == wanted:
        return path
    log(f"creating the peer's virtualenv in {path} (PyPI: {', '.join(PEER_REQUIREMENTS)})")
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run([str(path / "bin" / "pip"), "install", "-q", *PEER_REQUIREMENTS], check=True)
    # What a project made by `label-studio-ml init` installs (its requirements.txt: gunicorn and rq pinned);
    # the package itself imports rq and redis.
    generated, = path.glob("lib/python*/site-packages/label_studio_ml/default_configs/requirements.txt")
    subprocess.run([str(path / "bin" / "pip"), "install", "-q", "-r", str(generated)], check=True)
    stamp.write_text(wanted)
    return path


class PeerBackend:
    """Label Studio's example ML backend layout (label-studio-ml init + its Dockerfile's gunicorn command)."""

    def __init__(self, venv: Path, workdir: Path, training: dict, label_config: str, log):
        from sense7.processes import free_port

        self.venv, self.workdir, self.label_config, self.log = venv, workdir, label_config, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "src").mkdir(parents=True, exist_ok=True)
        (workdir / "src" / "peer_model.py").write_text(PEER_MODEL)
        (workdir / "training.json").write_text(json.dumps(training))
        self.process = None

    def __enter__(self):
        bin_dir = self.venv / "bin"
        subprocess.run([str(bin_dir / "label-studio-ml"), "init", "peer", "--root-dir", str(self.workdir), "--force",
                        "--script", str(self.workdir / "src" / "peer_model.py") + ":PeerModel"],
                       check=True, capture_output=True)
        project = self.workdir / "peer"
        command = re.search(r"exec (gunicorn .*)", (project / "Dockerfile").read_text()).group(1).split()
        command = [str(bin_dir / "gunicorn")] + [f"127.0.0.1:{self.port}" if a == ":$PORT" else a for a in command[1:]]
        self.log("peer: " + " ".join(command[1:]))
        env = dict(os.environ, PEER_TRAINING=str(self.workdir / "training.json"), PYTHONPATH=str(project))
        env.pop("VIRTUAL_ENV", None)
        self.process = subprocess.Popen(command, cwd=project, env=env, stdout=subprocess.DEVNULL,
                                        stderr=open(self.workdir / "peer.log", "wb"))
        deadline = time.monotonic() + 900  # the fit at import: ~20 s on a quiet machine, minutes on a loaded one
        while True:
            try:
                answer = requests.post(f"{self.url}/setup", json={"project": "1.1700000000",
                                                                  "schema": self.label_config}, timeout=5)
                if answer.status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()  # not called by `with` when __enter__ raises
                raise SystemExit(f"the peer did not start: {(self.workdir / 'peer.log').read_text()[-2000:]}")
            time.sleep(0.5)

    def __exit__(self, *exc):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()


def prepare(home: Path, n_conversations: int, n_raters: int, seed: int, encoder: str = "ngrams"):
    from sense7.synthetic import synth
    from sense7.store.database import Store
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
    params = None
    if encoder == "static":
        from sense7.model.estimators import RELATIONAL_SCALE

        params = {"text_encoder": "static", "relational_weight": RELATIONAL_SCALE}
    bundle = train_bundle(data.rating_data(), "v1", data.taxonomy, personalized_params=params)
    print(f"trained bundle v1 ({encoder}) on {len(data.ratings)} ratings in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    registry = ModelRegistry.from_settings(settings)
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
    if encoder != "ngrams":
        # What the embed job does when conversations enter (tasks/embedding.py): the served version's encoder.
        from sense7.model.vector_cache import embed_stored_conversations, encoders_to_embed

        done = embed_stored_conversations(store, encoders_to_embed(settings, registry))
        print(f"embedded the stored conversations' texts: {done}", file=sys.stderr)
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
    return settings, tasks, data


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


def run_wrk(url: str, script: Path, connections: int, duration: int) -> str:
    return subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(script), url],
                          check=True, capture_output=True, text=True).stdout


def check_answers(url: str, bodies: list[str], auth: str, batch: int, ours: bool, embedded: bool = False) -> list[str]:
    """One result per task, eight ratings each; ours: of version v1, no per-task error; embedded: every answer
    read its texts' vectors (`text_vectors: embedded`). The kinds served."""
    kinds = set()
    for line in bodies[:16]:
        results = requests.post(f"{url}/predict", data=line, timeout=30,
                                headers={"Content-Type": "application/json", "Authorization": auth}).json()["results"]
        assert len(results) == batch, results
        assert all(len(r["result"]) == 8 and (not ours or ("error" not in r and r["model_version"] == "v1"))
                   for r in results), results
        assert not embedded or all(r.get("text_vectors") == "embedded" for r in results), results
        kinds.update(r.get("kind", "peer") for r in results)
    return sorted(kinds)


def main() -> int:
    parser = argument_parser(__doc__, out=True, full_help=True)
    parser.add_argument("--duration", type=int, default=30)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="1: gevent workers (the default)")
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--raters", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--encoder", choices=("ngrams", "static"), default="ngrams",
                        help="the served model's text encoder: ngrams (the default model) or static, its vectors "
                             "embedded into the store beforehand (see above)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary SENSE7_HOME")
    parser.add_argument("--half-open", type=int, default=0, metavar="N",
                        help="measure each batch again under N half-open connections (issue 23)")
    parser.add_argument("--peer", action="store_true",
                        help="also measure Label Studio's example ML backend under the same load (see above)")
    parser.add_argument("--peer-venv", type=Path, default=Path.home() / ".cache" / "sense7" / "bench-peer-venv",
                        help="the peer's virtualenv, created on first use (default: %(default)s)")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        print("wrk not found: apt-get install -y wrk", file=sys.stderr)
        return 2
    log = logger("bench_backend")

    from sense7.stack import Stack
    from sense7.taxonomy import load_taxonomy, render_rating_config

    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    venv = peer_venv(args.peer_venv, log) if args.peer else None
    home = Path(tempfile.mkdtemp(prefix="sense7-bench-"))
    settings, tasks, data = prepare(home, args.conversations, args.raters, args.seed, args.encoder)
    label_config = render_rating_config(load_taxonomy())
    auth = "Basic " + base64.b64encode(b"bench:bench-pass").decode()
    rows, peer_rows = [], []
    with contextlib.ExitStack() as running:
        stack = running.enter_context(Stack(settings))
        stack.start_backend(workers=args.workers, threads=args.threads)
        server = stack.backend
        peer = None
        if args.peer:
            started = time.perf_counter()
            peer = running.enter_context(PeerBackend(venv, home / "peer", peer_training(data, tasks), label_config,
                                                     log))
            log(f"peer up at {peer.url} in {time.perf_counter() - started:.1f} s (fitted at import)")
        for batch in args.batches:
            bodies_path = home / f"bodies-{batch}.jsonl"
            bodies = write_bodies(bodies_path, tasks, batch, label_config)
            kinds = check_answers(server.url, bodies, auth, batch, ours=True, embedded=args.encoder != "ngrams")
            script = home / f"bench-{batch}.lua"
            script.write_text(LUA % {"bodies": bodies_path, "auth": auth})
            # warm-up: every worker has loaded its model and its caches before the measured run
            subprocess.run(["wrk", "-t2", f"-c{args.connections}", "-d3s", "-s", str(script), server.url],
                           check=True, capture_output=True)

            def measured(label):
                cpu_before = worker_cpu_seconds(server.pid())
                out = run_wrk(server.url, script, args.connections, args.duration)
                cpu = worker_cpu_seconds(server.pid())
                # How the load spread over the workers: a worker that accepted most keep-alive connections
                # does most of the work while the other idles (see docs/BENCHMARKS.md).
                used = sorted((cpu[pid] - cpu_before.get(pid, 0.0) for pid in cpu), reverse=True)
                stats = parse_wrk(out)
                stats.update(batch=label, tasks_per_s=stats["req_per_s"] * batch, kinds=kinds,
                             worker_cpu="/".join(f"{s:.0f}" for s in used),
                             cpu_ms=sum(used) * 1000 / max(stats["requests"], 1))
                rows.append(stats)
                print(out, file=sys.stderr)
                return stats

            idle = measured(batch)
            if args.half_open:
                host, port = server.url.rsplit("/", 1)[1].split(":")
                with HalfOpenClients(host, int(port), args.half_open) as held:
                    loaded = measured(f"{batch} +{args.half_open} half-open")
                loaded["batch"] += f" (p99 {loaded['p99_ms'] / idle['p99_ms']:.2f}x idle, {held.reopened} reopened)"
            if peer:
                peer_kinds = check_answers(peer.url, bodies, auth, batch, ours=False)
                subprocess.run(["wrk", "-t2", f"-c{args.connections}", "-d3s", "-s", str(script), peer.url],
                               check=True, capture_output=True)
                cpu_before = worker_cpu_seconds(peer.process.pid)
                out = run_wrk(peer.url, script, args.connections, args.duration)
                cpu = worker_cpu_seconds(peer.process.pid)
                print(out, file=sys.stderr)
                stats = parse_wrk(out)
                used = sum(cpu[pid] - cpu_before.get(pid, 0.0) for pid in cpu)
                stats.update(batch=f"{batch} peer", tasks_per_s=stats["req_per_s"] * batch, kinds=peer_kinds,
                             worker_cpu=f"{used:.0f}", cpu_ms=used * 1000 / max(stats["requests"], 1),
                             ratio=idle["req_per_s"] / stats["req_per_s"])
                stats["cpu_ratio"] = stats["cpu_ms"] / idle["cpu_ms"]
                idle["cpu_ratio_to_peer"] = stats["cpu_ratio"]
                peer_rows.append(stats)
                idle["ratio_to_peer"] = stats["ratio"]
                rows.append(stats)
    if not args.keep:
        shutil.rmtree(home, ignore_errors=True)
    kind = "gevent" if args.threads == 1 else "gthread"
    setup = (f"model: {args.encoder}, gunicorn {args.workers} workers x {args.threads} threads ({kind}), wrk -t2 -c{args.connections} "
             f"-d{args.duration}s, {os.cpu_count()} cores, load average before/after: {load_before} / "
             f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    # "x peer": requests/s over the peer's in the same run; "CPU x peer": the peer's server CPU time per request
    # over ours (steadier than requests/s on a machine other programs load).
    table = [setup, "| batch | requests/s | tasks/s | p50 ms | p90 ms | p99 ms | errors | worker CPU s | "
                    "CPU ms/request | kinds served | x peer | CPU x peer |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in rows:
        ratio, cpu_ratio = r.get("ratio_to_peer"), r.get("cpu_ratio_to_peer")
        table.append(f"| {r['batch']} | {r['req_per_s']:.0f} | {r['tasks_per_s']:.0f} | {r['p50_ms']:.1f} | "
                     f"{r['p90_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} | {r['worker_cpu']} | {r['cpu_ms']:.2f} | "
                     f"{', '.join(r['kinds'])} | {f'{ratio:.2f}x' if ratio else ''} | "
                     f"{f'{cpu_ratio:.2f}x' if cpu_ratio else ''} |")
    print("\n".join(table), file=sys.stderr)
    emit({"setup": setup, "rows": rows, "peer": "label-studio-ml 1.0.9 example layout (scripts/bench_backend.py)"
          if args.peer else None,
          "ratio_to_peer": {str(r["batch"]).split()[0]: round(r["ratio"], 2) for r in peer_rows},
          "cpu_ratio_to_peer": {str(r["batch"]).split()[0]: round(r["cpu_ratio"], 2) for r in peer_rows}}, args.out)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
