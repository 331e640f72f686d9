"""Coalesce concurrent /predict calls of one process into one model call (dynamic batching).

A model call costs ~15 ms of fixed pandas/scikit-learn overhead plus well under a millisecond per task,
so sixteen one-task requests answered one by one cost sixteen times what one sixteen-task call costs.
No extra thread and no timer: the first caller to find the model idle becomes the *leader*, takes every
request queued at that moment (its own included), runs one call and hands each caller its slice. Callers
arriving meanwhile queue up and the next leader takes them all. An idle server therefore adds no latency,
and a busy one batches exactly as much as arrived during the previous call.
"""

from __future__ import annotations

import threading
from typing import Any, Callable


class _Slot:
    __slots__ = ("items", "key", "context", "result", "error", "done")

    def __init__(self, items: list, key: Any, context: Any):
        self.items, self.key, self.context = items, key, context
        self.result: list | None = None
        self.error: BaseException | None = None
        self.done = False


class MicroBatcher:
    """`run(items, key, context)` returns `fn(all_items, context)[own slice]`.

    Requests are only combined when their `key` is equal (e.g. the model version they were routed to);
    `max_items` bounds one call. If the combined call raises, every caller in it gets that exception
    (and can retry alone).
    """

    def __init__(self, fn: Callable[[list, Any], list], max_items: int = 512):
        self.fn = fn
        self.max_items = max_items
        self._cond = threading.Condition()
        self._queue: list[_Slot] = []
        self._busy = False
        self.calls = 0  # model calls made (for tests and benchmarks)

    def waiting(self) -> int:
        """Requests queued behind the model call in progress (for tests and benchmarks)."""
        with self._cond:
            return len(self._queue)

    def run(self, items: list, key: Any = None, context: Any = None) -> list:
        slot = _Slot(items, key, context)
        with self._cond:
            self._queue.append(slot)
            while not slot.done and self._busy:
                self._cond.wait()
            if slot.done:
                return self._outcome(slot)
            self._busy = True
            batch = self._take(slot)
        try:
            self._execute(batch)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
        return self._outcome(slot)

    def _take(self, own: _Slot) -> list[_Slot]:
        """The leader's batch: its own slot, then queued slots with its key, oldest first, up to max_items."""
        batch, rest, size = [own], [], len(own.items)
        for s in self._queue:
            if s is own:
                continue
            if s.key == own.key and size + len(s.items) <= self.max_items:
                batch.append(s)
                size += len(s.items)
            else:
                rest.append(s)
        self._queue = rest
        return batch

    def _execute(self, batch: list[_Slot]) -> None:
        items = [item for s in batch for item in s.items]
        try:
            self.calls += 1
            results = self.fn(items, batch[0].context)
            if len(results) != len(items):
                raise RuntimeError(f"batched call returned {len(results)} results for {len(items)} items")
        except BaseException as exc:  # noqa: BLE001 - handed to every caller of this batch
            for s in batch:
                s.error, s.done = exc, True
            return
        start = 0
        for s in batch:
            s.result, s.done = results[start:start + len(s.items)], True
            start += len(s.items)

    @staticmethod
    def _outcome(slot: _Slot) -> list:
        if slot.error is not None:
            raise slot.error
        return slot.result
