"""What the benchmark scripts share: their command line (`argument_parser`), progress lines (`logger`), a fresh
home on free ports for the stack they measure (`fresh_home`, then `sense7.stack.Stack`), the annotations
they post, and their one JSON document of figures (`emit`).

A script imports it as `benchkit` (Python puts the script's folder first on the path); scripts never import
from tests/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sense7.labelstudio.protocol import rating_result
from sense7.processes import free_port
from sense7.settings import Settings
from sense7.synthetic import toy_study
from sense7.taxonomy import Taxonomy

REPO = Path(__file__).resolve().parent.parent


def stop_cleanly_on_sigterm() -> None:
    """A SIGTERM (`kill`, `timeout`) ends the script as an exception does, so its `with Stack(...)` blocks stop
    what they started: otherwise Python dies at once and Label Studio, Redis, the workers and the pages it
    started keep running, orphans holding ports and the machine's cores."""
    import signal

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def argument_parser(doc: str, out: bool = True, full_help: bool = False) -> argparse.ArgumentParser:
    """The script's parser: its docstring's first paragraph (or all of it) as the description, and
    `--out FILE` for the JSON document. Every benchmark builds one first, so this is also where a SIGTERM is
    made to stop what the script starts (`stop_cleanly_on_sigterm`)."""
    stop_cleanly_on_sigterm()
    if full_help:
        made = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    else:
        made = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    if out:
        made.add_argument("--out", type=Path, default=None, help="also write the JSON document here")
    return made


def logger(name: str) -> Callable[[str], None]:
    """A progress line on stderr, `[name HH:MM:SS] message` (stdout is the JSON document)."""

    def log(message: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    return log


def fresh_home(prefix: str, **env: str) -> Settings:
    """A new SENSE7_HOME in a temporary folder with Label Studio, the ML backend and the rater page on free
    ports, exported to this process's environment (the stack's processes inherit it) with `env` on top; a
    configured Redis or store is dropped, so the stack starts its own."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ.update({"SENSE7_HOME": str(tmp / "home"), "SENSE7_LS_PORT": str(free_port()),
                       "SENSE7_BACKEND_PORT": str(free_port()), "SENSE7_RATER_PAGE_PORT": str(free_port()), **env})
    for name in ("SENSE7_REDIS_URL", "SENSE7_STORE_URL"):
        if name not in env:
            os.environ.pop(name, None)
    return Settings.from_env()


def label_studio_and_broker(stack, taxonomy: Taxonomy):
    """Start the stack's Label Studio and Redis; (client, rating project, profile project, store)."""
    from sense7.store.database import Store
    from sense7.labelstudio import client as ls_client

    stack.start_label_studio()
    stack.start_redis()
    client = ls_client.connect(stack.cfg)
    rating, profile = ls_client.ensure_projects(client, stack.cfg, taxonomy)
    return client, rating, profile, Store(stack.cfg.store_url)


def toy_annotation(turn_text: str, taxonomy: Taxonomy, bias: int = 0) -> list[dict]:
    """A full rating annotation of a toy-study turn (sense7.synthetic.toy_study): warm turns high, cold ones low,
    shifted by the rater's bias."""
    level = toy_study.turn_level(turn_text, bias)
    return rating_result({c: level for c in taxonomy.controls}, taxonomy, "yes" if level >= 3 else "no")


def emit(figures: dict, out: Path | None = None) -> None:
    """Print the figures as one JSON document, and write it to `out` too."""
    text = json.dumps(figures, indent=2)
    print(text)
    if out:
        out.write_text(text)


class StoreWatch(threading.Thread):
    """First time each task id has an annotation in the store (polled every 100 ms)."""

    def __init__(self, store):
        super().__init__(daemon=True)
        self.store, self.seen, self.running = store, {}, True

    def run(self) -> None:
        from sqlalchemy import select

        from sense7.store.tables import annotations

        while self.running:
            with self.store.engine.connect() as conn:
                ids = [r[0] for r in conn.execute(select(annotations.c.task_id))]
            now = time.time()
            for task_id in ids:
                self.seen.setdefault(task_id, now)
            time.sleep(0.1)


def promote_synthetic_version(cfg, tax) -> str:
    """A version trained on a small synthetic study (none of the bench's raters), promoted: the served
    version whose posterior live pre-fills update."""
    from sense7.synthetic.synth import generate
    from sense7.model.bundle import train_bundle
    from sense7.model.registry import ModelRegistry

    registry = ModelRegistry.from_settings(cfg)
    name = registry.next_version()
    registry.promote(registry.add(train_bundle(generate(60, 10, seed=0, taxonomy=tax).rating_data(), name, tax),
                                  name).name)
    return name


def summary(seconds) -> dict:
    """n, p50, p99 and max of durations given in seconds, in milliseconds."""
    import numpy as np

    values = np.asarray(seconds, dtype=float)
    if not values.size:
        return {"n": 0}
    return {"n": int(values.size), "p50_ms": round(float(np.percentile(values, 50)) * 1000, 1),
            "p99_ms": round(float(np.percentile(values, 99)) * 1000, 1),
            "max_ms": round(float(values.max()) * 1000, 1)}


class HeldConnections(threading.Thread):
    """`n` connections to (host, port) that each sent part of a request's header line and then nothing (the
    attack of issue 37, item 5); one the server closes is replaced at once, so that `n` are held all along.
    `closed_by_server` counts the replacements."""

    HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: abc"

    def __init__(self, host: str, port: int, n: int):
        super().__init__(daemon=True)
        self.address, self.n = (host, port), n
        self.open: list = []
        self.closed_by_server = 0
        self.ready, self.stopping = threading.Event(), threading.Event()

    def connect(self):
        import socket

        sock = socket.create_connection(self.address, timeout=10)
        sock.sendall(self.HEAD)
        sock.setblocking(False)
        return sock

    def run(self) -> None:
        import select

        self.open = [self.connect() for _ in range(self.n)]
        self.ready.set()
        while not self.stopping.is_set():
            readable, _, _ = select.select(self.open, [], [], 0.1)
            for sock in readable:
                try:
                    if sock.recv(4096):
                        continue  # an answer (none is expected): the end comes next
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    pass
                self.open.remove(sock)
                sock.close()
                self.closed_by_server += 1
                self.open.append(self.connect())

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        for sock in self.open:
            sock.close()


class PostgresCluster:
    """A PostgreSQL server of the benchmark's own: `initdb` in a temporary folder (trust authentication), listening
    on 127.0.0.1 at a free port, with enough connections for every process of the stack. Every backend process is
    then the benchmark's, so the server's CPU time (`pid()`'s process tree) is attributable, which the machine's
    shared server is not. As root it runs as the `postgres` user (PostgreSQL refuses root), in a folder of its own
    under the temporary directory (a home's 0700 folder would keep that user out); `stop()` removes it."""

    def __init__(self, max_connections: int = 300):
        import glob

        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
        if not found:
            raise RuntimeError("PostgreSQL's server is not installed (Debian: apt-get install postgresql)")
        self.bin = Path(found[-1]).parent
        self.folder, self.max_connections = Path(tempfile.mkdtemp(prefix="bench-postgres-")), max_connections
        self.data = self.folder / "data"
        self.port = free_port()
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def run(self, *cmd: str) -> None:
        import subprocess

        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*as_postgres, *cmd], capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{Path(cmd[0]).name} failed: {done.stderr[-2000:] or done.stdout[-2000:]}")

    def start(self) -> "PostgresCluster":
        import shutil

        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        self.folder.chmod(0o700)
        self.run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync",
                 "--encoding=UTF8", "--locale=C")
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder} "
                   f"-c max_connections={self.max_connections}")
        self.run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "server.log"), "-o", options,
                 "-w", "start")
        return self

    def create_database(self, name: str) -> str:
        """A new empty database; its SQLAlchemy URL."""
        import psycopg2

        admin = psycopg2.connect(self.admin_url, connect_timeout=5)
        admin.autocommit = True
        admin.cursor().execute(f"CREATE DATABASE {name}")
        admin.close()
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"

    def pid(self) -> int:
        """The postmaster's pid (its children: one backend per connection, and the server's own processes)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        import shutil

        if (self.data / "postmaster.pid").exists():
            self.run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)
