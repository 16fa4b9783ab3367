"""Running a composer over many seeds at once, where one seed can never cost the others.

A composer that runs operators (the deterministic one sizes each task by timing it) works in
worker processes: a seed whose operators crash the process (a segfault in a kernel library) or
hang it becomes that seed's error, and a fresh process takes the next seed. Each process may be
given a device (:class:`~cuda_agent.synth.devices.LaneDevice`): it then sees that GPU alone and
sizes its tasks there. A composer that waits on an endpoint (the LLM one) works in threads.

Worker side: ``python -m cuda_agent.synth.compose_workers`` speaks the environment's worker
protocol (:mod:`cuda_agent.environment.worker`) with two requests, ``setup`` (unpickle the
composer from a file the parent wrote) and ``compose`` (one seed).
"""

from __future__ import annotations

import contextlib
import pickle
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from cuda_agent.environment.worker import RemoteError, WorkerError, WorkerProcess, child_env, serve
from cuda_agent.synth.devices import LaneDevice
from cuda_agent.synth.lanes import run_in_lanes
from cuda_agent.synth.records import TaskRecord

Composer = Callable[[int], TaskRecord]

SEED_TIMEOUT_S = 600.0
"""Limit on composing one seed in a worker process before it is killed and the seed given up."""


def compose_entry(composer: Composer, seed: int) -> dict[str, Any]:
    """``{"seed", "record": row}``, or ``{"seed", "error"}`` when the composer cannot make a task
    (it raised ``ValueError`` / ``RuntimeError``)."""
    try:
        return {"seed": seed, "record": composer(seed).to_row()}
    except (ValueError, RuntimeError) as exc:
        return {"seed": seed, "error": f"{type(exc).__name__}: {exc}"}


class ComposerProcess:
    """A lane: one worker process holding the composer; restarted after a seed kills it. With a
    ``device``, the process sees that GPU alone."""

    def __init__(self, pickled: Path, scratch: Path, timeout_s: float = SEED_TIMEOUT_S,
                 device: LaneDevice | None = None) -> None:
        self.pickled, self.scratch, self.timeout_s, self.device = pickled, scratch, timeout_s, device
        self._worker: WorkerProcess | None = None

    def __call__(self, seed: int) -> dict[str, Any]:
        try:
            reply = self._live_worker().request({"op": "compose", "seed": seed}, self.timeout_s)
        except WorkerError as exc:
            self.close()
            return {"seed": seed, "error": f"{type(exc).__name__}: the composer process {exc}"}
        except RemoteError as exc:  # not a composer refusal: a bug, kept as this seed's error
            return {"seed": seed, "error": str(exc)}
        return reply["entry"]

    def _live_worker(self) -> WorkerProcess:
        if self._worker is None:
            worker = WorkerProcess("cuda_agent.synth.compose_workers", cwd=self.scratch,
                                   env=child_env(None if self.device is None else self.device.env()),
                                   log_path=self.scratch / "composer.log")
            # The parent's import path, so a composer class from any module the parent imported unpickles.
            worker.request({"op": "setup", "path": str(self.pickled), "sys_path": sys.path}, self.timeout_s)
            self._worker = worker
        return self._worker

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None


@contextlib.contextmanager
def composer_lanes(composer: Composer, devices: Sequence[LaneDevice | None]) -> Iterator[list[Callable[[int], dict]]]:
    """One lane (``seed -> compose_entry``) per entry of ``devices``; closes them on exit.

    ``composer.parallel == "processes"`` (it must pickle) runs it in worker processes, each on its
    device (``None``: the devices this process sees); anything else (a plain function, an LLM
    composer) in threads of this process, where the devices do not apply.
    """
    if getattr(composer, "parallel", "threads") != "processes":
        yield [lambda seed: compose_entry(composer, seed)] * len(devices)
        return
    scratch = Path(tempfile.mkdtemp(prefix="cuda-agent-composer-"))
    pickled = scratch / "composer.pickle"
    pickled.write_bytes(pickle.dumps(composer))
    lanes = [ComposerProcess(pickled, scratch, device=device) for device in devices]
    try:
        yield lanes
    finally:
        for lane in lanes:
            lane.close()
        shutil.rmtree(scratch, ignore_errors=True)


def compose_parallel(composer: Composer, seeds: list[int], workers: int,
                     deadline: float | None = None) -> Iterator[dict[str, Any]]:
    """One :func:`compose_entry` per seed, in the order they finish, ``workers`` at once (see
    :func:`composer_lanes`), until ``deadline`` (``time.monotonic()``)."""
    if not seeds:
        return
    with composer_lanes(composer, [None] * min(workers, len(seeds))) as lanes:
        for _, entry in run_in_lanes(lanes, seeds, deadline):
            yield entry


def main() -> None:
    composer: list[Composer] = []

    def setup(message: dict[str, Any]) -> dict[str, Any]:
        sys.path.extend(path for path in message["sys_path"] if path not in sys.path)
        composer[:] = [pickle.loads(Path(message["path"]).read_bytes())]  # noqa: S301 - written by our parent
        return {}

    def compose(message: dict[str, Any]) -> dict[str, Any]:
        return {"entry": compose_entry(composer[0], int(message["seed"]))}

    serve({"setup": setup, "compose": compose})


if __name__ == "__main__":
    main()
