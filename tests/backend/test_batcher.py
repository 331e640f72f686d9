"""Dynamic batching: concurrent callers share model calls and each gets exactly its own results."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sense7.ml_backend.batcher import MicroBatcher


def wait_until(condition, what: str, seconds: float = 10.0) -> None:
    """Poll until `condition()` holds; a regression fails here after `seconds` instead of hanging the run."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what} after {seconds:.0f} s"
        time.sleep(0.001)


def test_concurrent_callers_are_coalesced_and_get_their_own_slice():
    gate = threading.Event()
    seen = []

    def fn(items, context):
        seen.append(list(items))
        if len(seen) == 1:
            assert gate.wait(10)  # hold the first call so the others queue up behind it
        return [(context, x * 10) for x in items]

    batcher = MicroBatcher(fn)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(batcher.run, [0], "k", "ctx")
        wait_until(lambda: seen, "the first call")
        rest = [pool.submit(batcher.run, [i, i + 100], "k", "ctx") for i in range(1, 7)]
        wait_until(lambda: batcher.waiting() == 6, "six queued callers")
        gate.set()
        assert first.result(10) == [("ctx", 0)]
        for i, future in enumerate(rest, start=1):
            assert future.result(10) == [("ctx", i * 10), ("ctx", (i + 100) * 10)]
    assert batcher.calls == 2  # one for the first caller, one for all six that queued meanwhile
    assert sorted(seen[1]) == sorted(x for i in range(1, 7) for x in (i, i + 100))


def test_different_keys_are_never_mixed_and_max_items_is_respected():
    calls = []
    gate = threading.Event()

    def fn(items, context):
        calls.append((context, list(items)))
        if len(calls) == 1:
            assert gate.wait(10)
        return [context] * len(items)

    batcher = MicroBatcher(fn, max_items=4)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(batcher.run, [0], "v1", "v1")
        wait_until(lambda: calls, "the first call")
        futures = [pool.submit(batcher.run, [i, i], key, key) for i, key in
                   enumerate(["v1", "v2", "v1", "v2", "v1"], start=1)]
        wait_until(lambda: batcher.waiting() == 5, "five queued callers")
        gate.set()
        first.result(10)
        answers = [f.result(10) for f in futures]
    assert answers == [["v1"] * 2, ["v2"] * 2, ["v1"] * 2, ["v2"] * 2, ["v1"] * 2]
    for context, items in calls:
        assert len(items) <= 4 or len(calls) == 1
    assert all(len(set(answer)) == 1 for answer in answers)


def test_a_failing_call_fails_its_callers_only():
    def fn(items, context):
        if "bad" in items:
            raise ValueError("bad item")
        return items

    batcher = MicroBatcher(fn)
    with pytest.raises(ValueError, match="bad item"):
        batcher.run(["bad"])
    assert batcher.run(["good"]) == ["good"]
    with pytest.raises(RuntimeError, match="returned 0 results for 1 items"):
        MicroBatcher(lambda items, c: []).run(["x"])
