"""Parsing from many threads at once: CPython 3.11's AST constructor shares a recursion counter
across threads, so a garbage collection inside one ``ast.parse`` that switches to another parsing
thread made one of them fail (a rollout episode was lost in CI). ``parse_source`` serialises them.
Under the load below, plain ``ast.parse`` failed once in every run on Python 3.11.7."""

from __future__ import annotations

import sys
import threading
import time

from cuda_agent.environment import evaluator
from cuda_agent.python_source import parse_source

SOURCE = open(evaluator.__file__).read()


class _Cycle:
    """Garbage only a collection frees, whose finalizer lets other threads run."""

    def __init__(self) -> None:
        self.itself = self

    def __del__(self) -> None:
        time.sleep(0)


def test_threads_parsing_at_once_under_garbage_collection_all_succeed() -> None:
    errors: list[BaseException] = []

    def parse_repeatedly() -> None:
        for _ in range(15):
            for _ in range(200):
                _Cycle()
            try:
                parse_source(SOURCE)
            except SystemError as exc:
                errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=parse_repeatedly) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
