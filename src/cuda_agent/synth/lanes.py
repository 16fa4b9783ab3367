"""Parallel lanes: each lane handles one item at a time, results come back as they finish.

Both parallel stages of the pipeline (composing and filtering) work this way: a lane owns a
worker process (or, for an LLM, an HTTP request in flight), and a lane that finished an item is
fed the next one at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def run_in_lanes(lanes: Sequence[Callable[[Item], Result]], items: Iterable[Item],
                 deadline: float | None = None) -> Iterator[tuple[Item, Result]]:
    """``(item, lane(item))`` pairs in the order they finish, one thread per lane.

    No item starts after ``deadline`` (``time.monotonic()``); items still in flight then are
    dropped, as they are when the caller stops iterating (Ctrl-C): the caller closes its lanes to
    stop them.
    """
    pool = ThreadPoolExecutor(max_workers=max(1, len(lanes)), thread_name_prefix="lane")
    queue = iter(items)
    running: dict[Future, tuple[Callable[[Item], Result], Item]] = {}

    def feed(lane: Callable[[Item], Result]) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            return
        for item in queue:
            running[pool.submit(lane, item)] = (lane, item)
            return

    try:
        for lane in lanes:
            feed(lane)
        while running:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
            if not ready:
                return  # the deadline passed with items in flight
            for future in ready:
                lane, item = running.pop(future)
                yield item, future.result()
                feed(lane)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
