"""The work of a pool, whatever hosts it: building a job ahead of time, and evaluating it.

The same two methods run in the local pool (builds in the parent's compile threads, evaluations in
one worker process per GPU) and in Ray actors. Neither imports candidate code: building happens in
the build cache's compile child, evaluating in ``environment.evaluate()``'s reference and candidate
processes.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from cuda_agent.environment import EvalConfig, Prestarter, SolutionError, Verdict, evaluate, load_solution
from cuda_agent.environment.build import CompileError, build_solution
from cuda_agent.environment.device_share import DeviceShare
from cuda_agent.environment.guards import run_static_guards
from cuda_agent.environment.slots import default_prestart_slots
from cuda_agent.pool.jobs import EvalJob

logger = logging.getLogger(__name__)

def default_staging_dir(config: EvalConfig) -> Path:
    return config.cache_dir / "staged"


class PoolWork:
    """Builds and evaluates jobs under one ``EvalConfig``.

    Args:
        config: the evaluation settings every job gets.
        staging_dir: where jobs' files are written (content-addressed, shared by all workers).
        device_lock: a name for ``cuda_agent.synth.device_lock.measuring``, held for each whole
            evaluation, so that two pools on one host never time on the same GPU at once; None on
            the CPU backend (CPU lanes are as many as the user asked for).
        prestart_slots: worker slots kept started and warm ahead of the evaluations (see
            :class:`~cuda_agent.environment.Prestarter`), made on the first evaluation; 0: none;
            None: :func:`~cuda_agent.environment.slots.default_prestart_slots`, divided among the
            lanes of a shared GPU.
        lanes_on_gpu: evaluation lanes (processes) sharing this GPU. Above 1 the lock is held only
            for each evaluation's device work, alone for its measurements and shared for the rest
            (:mod:`~cuda_agent.environment.device_share`).
    """

    def __init__(self, config: EvalConfig, staging_dir: Path, device_lock: str | None = None,
                 prestart_slots: int | None = None, lanes_on_gpu: int = 1) -> None:
        self.config = config
        self.staging_dir = staging_dir
        self.device_lock = device_lock
        self.share: DeviceShare | None = None
        if device_lock is not None and lanes_on_gpu > 1:
            from cuda_agent.synth.device_lock import measuring, using

            self.share = DeviceShare(measure=lambda: measuring(device_lock), use=lambda: using(device_lock),
                                     evaluations=lanes_on_gpu)
        default_slots = -(-default_prestart_slots(config.device) // lanes_on_gpu)
        self.prestart_slots = prestart_slots if prestart_slots is not None else default_slots
        self._prestarter: Prestarter | None = None

    def build(self, job: EvalJob) -> None:
        """Fill the build cache for ``job`` (a compiler rejection is recorded there too), unless the
        static guards reject it first: guarded sources are never compiled or imported. Never raises
        for the candidate's faults; the evaluation reports them."""
        try:
            solution = load_solution(job.solution.stage(self.staging_dir))
        except SolutionError:
            return
        if self.config.guards.enabled and run_static_guards(solution, self.config.guards):
            return
        try:
            build_solution(solution, self.config.device, self.config.build, self.config.cache_dir, self.config.sandbox)
        except CompileError as exc:
            logger.debug("job %s did not build: %s", job.job_id, exc)

    def evaluate(self, job: EvalJob) -> Verdict:
        """The verdict of ``job`` (a cache hit for what :meth:`build` built)."""
        path = job.solution.stage(self.staging_dir)
        lock = contextlib.nullcontext()
        if self.device_lock is not None and self.share is None:
            from cuda_agent.synth.device_lock import measuring

            lock = measuring(self.device_lock)
        if self.prestart_slots and self._prestarter is None:
            self._prestarter = Prestarter(self.config, self.prestart_slots, share=self.share)
        with lock:
            return evaluate(job.task, path, self.config, prestarted=self._prestarter, share=self.share)

    def close(self) -> None:
        """Destroy the prestarted slots nobody took."""
        if self._prestarter is not None:
            self._prestarter.close()
            self._prestarter = None
