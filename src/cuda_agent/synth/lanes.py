"""Parallel lanes: each lane handles one item at a time and takes the next one itself.

Both parallel stages of the pipeline (composing and filtering) work this way: a lane owns a worker
process (or, for an LLM, an HTTP request in flight). A :class:`LaneGroup` is one stage: its lanes
are threads that take items from the group's inbox as soon as they are free, so work can be added
while the stage runs (composed tasks reach the filter while composition goes on), and a lane on a
faster device simply takes more items. Every finished item is put, as a :class:`Finished`, on an
outbox that one consumer reads: the pipeline's stages share one outbox, so a single thread journals
every decision in the order it was made.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class Finished(Generic[Item, Result]):
    """One item a lane finished."""

    group: str
    """Name of the :class:`LaneGroup` (the stage)."""
    lane: int
    """Index of the lane in its group."""
    item: Item
    _result: Result | None = None
    _raised: BaseException | None = field(default=None, repr=False)

    def result(self) -> Result:
        """The lane's return value; re-raises what the lane raised, in the consumer's thread."""
        if self._raised is not None:
            raise self._raised
        return self._result  # type: ignore[return-value]


class LaneGroup(Generic[Item, Result]):
    """One thread per lane; each takes the next item from the inbox, runs its lane on it and puts
    the :class:`Finished` on ``outbox``.

    No item starts after ``deadline`` (``time.monotonic()``). :meth:`stop` makes idle lanes exit;
    an item in flight then is the owner's to abandon (it closes the lanes' workers, as on Ctrl-C).
    """

    def __init__(self, name: str, lanes: Sequence[Callable[[Item], Result]], outbox: queue.Queue,
                 deadline: float | None = None) -> None:
        if not lanes:
            raise ValueError(f"lane group {name!r} needs at least one lane")
        self.name, self.outbox, self.deadline = name, outbox, deadline
        self._inbox: collections.deque[Item] = collections.deque()
        self._changed = threading.Condition()
        self._closed = self._stopped = False
        self._busy = 0
        self._threads = [threading.Thread(target=self._serve, args=(index, lane), name=f"{name}-lane-{index}",
                                          daemon=True) for index, lane in enumerate(lanes)]
        for thread in self._threads:
            thread.start()

    def put(self, items: Iterable[Item]) -> None:
        """Queue ``items`` for the lanes.

        Raises:
            RuntimeError: the group was closed (its lanes may have exited).
        """
        with self._changed:
            if self._closed:
                raise RuntimeError(f"lane group {self.name!r} is closed: no more items can be queued")
            self._inbox.extend(items)
            self._changed.notify_all()

    def close(self) -> None:
        """No more items will come: lanes exit once the inbox is empty."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def stop(self) -> None:
        """Lanes take no more items; queued ones stay queued (see :attr:`queued`)."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    @property
    def queued(self) -> int:
        """Items waiting for a lane."""
        return len(self._inbox)

    @property
    def in_flight(self) -> int:
        """Items a lane is working on now."""
        return self._busy

    @property
    def lanes(self) -> int:
        return len(self._threads)

    @property
    def finished(self) -> bool:
        """Closed, nothing queued, nothing in flight: every result is on the outbox."""
        with self._changed:
            return self._closed and not self._inbox and not self._busy

    def _next(self) -> tuple[bool, Any]:
        with self._changed:
            while True:
                if self._stopped or (self.deadline is not None and time.monotonic() >= self.deadline):
                    return False, None
                if self._inbox:
                    self._busy += 1
                    return True, self._inbox.popleft()
                if self._closed:
                    return False, None
                timeout = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
                self._changed.wait(timeout)

    def _serve(self, index: int, lane: Callable[[Item], Result]) -> None:
        while True:
            has_item, item = self._next()
            if not has_item:
                return
            finished: Finished = Finished(self.name, index, item)
            try:
                finished._result = lane(item)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, who re-raises it
                finished._raised = exc
            self.outbox.put(finished)  # before the count drops: `finished` must not be seen early
            with self._changed:
                self._busy -= 1
                self._changed.notify_all()


def next_finished(outbox: queue.Queue, groups: Sequence[LaneGroup], deadline: float | None) -> Finished | None:
    """The next finished item of ``groups``; ``None`` once every group has finished and the outbox
    is drained, or at ``deadline`` (``time.monotonic()``)."""
    while True:
        if all(group.finished for group in groups) and outbox.empty():
            return None
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return None
        try:
            return outbox.get(timeout=0.5 if remaining is None else min(0.5, remaining))
        except queue.Empty:
            continue


def run_in_lanes(lanes: Sequence[Callable[[Item], Result]], items: Iterable[Item],
                 deadline: float | None = None) -> Iterator[tuple[Item, Result]]:
    """``(item, lane(item))`` pairs in the order they finish, one thread per lane.

    No item starts after ``deadline`` (``time.monotonic()``); items still in flight then are
    dropped, as they are when the caller stops iterating (Ctrl-C): the caller closes its lanes to
    stop them.
    """
    outbox: queue.Queue = queue.Queue()
    group: LaneGroup = LaneGroup("lanes", lanes, outbox, deadline)
    group.put(items)
    group.close()
    try:
        while (finished := next_finished(outbox, [group], deadline)) is not None:
            yield finished.item, finished.result()
    finally:
        group.stop()
