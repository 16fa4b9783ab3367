"""The local pool: one evaluation worker process per GPU of this host (or N on the CPU backend),
fed by compile threads in this process.

Each GPU lane's worker sees exactly one GPU (``CUDA_VISIBLE_DEVICES`` set to that GPU's entry) and
runs one evaluation at a time under a per-GPU lock, so timings on a GPU never overlap, not even
with another pool on the same host. With ``lanes_per_gpu`` above 1 a GPU has that many lanes,
whose evaluations hold the lock for their device work only (``environment/device_share.py``).
A lane's evaluations keep their temporary files in the lane's own scratch folder, which is
emptied whenever its worker is restarted.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from cuda_agent.environment import EvalConfig, Verdict, timed_cpus
from cuda_agent.environment.owned_scratch import make_owned_dir, sweep_orphans
from cuda_agent.environment.slots import default_scratch_root
from cuda_agent.environment.worker import RemoteError, WorkerError, WorkerProcess, child_env
from cuda_agent.pool.base import EvalLane, JobRejected, LaneFailed
from cuda_agent.pool.config import PoolConfig, PoolConfigError
from cuda_agent.pool.jobs import EvalJob
from cuda_agent.pool.pipeline import LanePipeline
from cuda_agent.pool.work import PoolWork, default_staging_dir

logger = logging.getLogger(__name__)

SETUP_TIMEOUT_S = 300.0
"""Time a fresh worker may take to import the environment and accept its configuration."""
LANE_EXIT_S = 5.0
"""How long a closing lane waits for its worker to shut its slots down before killing it."""


def visible_gpus() -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` entries of the GPUs this process may use (indices or UUIDs)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip() and entry.strip() != "-1"]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


class ProcessLane(EvalLane):
    """A lane whose worker is a ``cuda_agent.pool.process_worker`` process.

    Args:
        name: the lane's name in results and stats (``cuda:1``, ``cpu:0``).
        config: evaluation settings (its ``scratch_dir`` is replaced by the lane's own folder).
        staging_dir: where jobs' files are written.
        scratch_root: the pool's scratch folder; the lane uses ``<scratch_root>/<name>``.
        gpu: the ``CUDA_VISIBLE_DEVICES`` entry the worker gets, or None (CPU lane).
        job_timeout_s: a worker silent this long on one job is killed.
        timed_cpu: the worker's ``CUDA_AGENT_TIMED_CPU`` (None: this process's).
        lanes_on_gpu: lanes of the pool sharing this lane's GPU.
        prestart_slots: worker slots its worker keeps warm ahead (``PoolConfig.prestart_slots``).
    """

    def __init__(self, name: str, config: EvalConfig, staging_dir: Path, scratch_root: Path,
                 gpu: str | None, job_timeout_s: float, timed_cpu: str | None = None, lanes_on_gpu: int = 1,
                 prestart_slots: int | None = None) -> None:
        self.name = name
        self.config, self.staging_dir, self.gpu, self.job_timeout_s = config, staging_dir, gpu, job_timeout_s
        self.timed_cpu, self.lanes_on_gpu, self.prestart_slots = timed_cpu, lanes_on_gpu, prestart_slots
        slug = name.replace(":", "-")
        self.scratch = scratch_root / slug
        self.log_path = scratch_root / f"{slug}.log"
        self._worker: WorkerProcess | None = None

    def start(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)  # a dead worker's unfinished evaluations
        (self.scratch / "evals").mkdir(parents=True)
        env = child_env({**({} if self.gpu is None else {"CUDA_VISIBLE_DEVICES": self.gpu}),
                         **({} if self.timed_cpu is None else {timed_cpus.ENV_VAR: self.timed_cpu})})
        worker = WorkerProcess("cuda_agent.pool.process_worker", env=env, cwd=self.scratch, log_path=self.log_path)
        self._worker = worker
        try:
            worker.request({"op": "setup", "config": self.config.replace(scratch_dir=self.scratch / "evals").to_dict(),
                            "staging_dir": str(self.staging_dir),
                            "device_lock": None if self.gpu is None else f"gpu-{self.gpu}",
                            "lanes_on_gpu": self.lanes_on_gpu, "prestart_slots": self.prestart_slots}, SETUP_TIMEOUT_S)
        except (WorkerError, RemoteError) as exc:
            raise RuntimeError(f"worker setup failed: {exc}\n{worker.log_tail(2000)}") from None

    def evaluate(self, job: EvalJob) -> Verdict:
        if self._worker is None:
            raise LaneFailed(f"lane {self.name} has no worker")
        try:
            reply = self._worker.request({"op": "evaluate", "job": job.to_json_dict()}, self.job_timeout_s)
        except WorkerError as exc:
            raise LaneFailed(f"worker {self.name} (pid {self._worker.proc.pid}) {exc}") from None
        except RemoteError as exc:
            raise JobRejected(f"the evaluation raised {exc}\n{exc.traceback[-2000:]}") from None
        return Verdict.from_json_dict(reply["verdict"])

    def interrupt(self) -> None:
        worker = self._worker
        if worker is not None:
            worker.kill_group()  # its slots' workers die with it; the lane's thread reaps it

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close(graceful_s=LANE_EXIT_S)  # its prestarted slots release their leases
            self._worker = None

    def describe(self) -> dict[str, Any]:
        worker = self._worker
        alive = worker is not None and worker.proc.poll() is None
        return {"pid": worker.proc.pid if alive else None, "gpu": self.gpu, "log": str(self.log_path)}


class LocalPool(LanePipeline):
    """:class:`LanePipeline` over :class:`ProcessLane` workers; removes its scratch folder on close."""

    def __init__(self, config: EvalConfig, pool_config: PoolConfig) -> None:
        staging_dir = pool_config.staging_dir or default_staging_dir(config)
        slots = _lane_slots(config, pool_config)
        root = Path(config.scratch_dir) if config.scratch_dir else default_scratch_root()
        for orphan in {*sweep_orphans(root), *sweep_orphans(default_scratch_root())}:
            logger.info("removed %s, left behind by a process that was killed", orphan)
        self.scratch_root = make_owned_dir("pool", root)
        settings = _lane_timed_cpus(config, [gpu for _, gpu in slots])
        sharing = Counter(gpu for _, gpu in slots)
        lanes = [ProcessLane(name, config, staging_dir, self.scratch_root, gpu, pool_config.job_timeout_s, setting,
                             sharing[gpu] if gpu is not None else 1, pool_config.prestart_slots)
                 for (name, gpu), setting in zip(slots, settings)]
        # The builds this process starts keep every lane's CPU free (the first lane's list holds them all).
        self._lane_cpus_set = len(slots) > 1 and settings[0] is not None
        self._replaced_setting = timed_cpus.use_setting(settings[0]) if self._lane_cpus_set else None
        work = PoolWork(config, staging_dir)
        super().__init__("local", lanes, work.build, pool_config.compile_workers or os.cpu_count() or 1,
                         pool_config.queue_size or 2 * len(lanes), pool_config.max_attempts)

    def close(self, cancel_pending: bool = False) -> None:
        super().close(cancel_pending)
        shutil.rmtree(self.scratch_root, ignore_errors=True)
        if self._lane_cpus_set:
            timed_cpus.use_setting(self._replaced_setting)


def _lane_timed_cpus(config: EvalConfig, lane_gpus: list[str | None]) -> list[str | None]:
    """Each lane's ``CUDA_AGENT_TIMED_CPU``, given each lane's GPU (lanes get only an allow-list
    of this process's environment, so it is always passed on): one GPU lane gets this process's
    setting; several get a CPU of their own for each GPU, shared by that GPU's lanes, where the
    host has CPUs to spare, else none set apart."""
    lanes = len(lane_gpus)
    if config.device != "cuda":
        return [None] * lanes
    try:
        timed_cpus.host_split()
    except timed_cpus.TimedCpuError as exc:
        raise PoolConfigError(str(exc)) from None
    setting = timed_cpus.current_setting()
    if lanes < 2:
        return [setting] * lanes
    if setting.strip().lower() == "off":
        return ["off"] * lanes
    if setting.strip().lower() not in ("", "auto"):
        raise PoolConfigError(f"{timed_cpus.ENV_VAR}={setting!r} names the CPUs of one evaluating process; with "
                              f"{lanes} GPU lanes use 'auto' (a CPU for each GPU) or 'off'")
    return list(timed_cpus.lane_settings(lane_gpus) or ["off"] * lanes)


def _lane_slots(config: EvalConfig, pool_config: PoolConfig) -> list[tuple[str, str | None]]:
    """``(lane name, GPU entry or None)`` for each lane: ``cuda:<gpu>`` for a GPU's first lane,
    ``cuda:<gpu>.<k>`` for its others, the GPUs taken in turn."""
    if config.device == "cpu":
        if pool_config.lanes_per_gpu > 1:
            raise PoolConfigError("pool.lanes_per_gpu is for device 'cuda'; on the CPU backend set pool.workers")
        return [(f"cpu:{i}", None) for i in range(pool_config.workers or 1)]
    gpus = list(pool_config.gpus) or visible_gpus()
    if not gpus:
        raise PoolConfigError("device is 'cuda' but no GPU is visible (check CUDA_VISIBLE_DEVICES and the driver)")
    per_gpu = pool_config.lanes_per_gpu
    workers = pool_config.workers or per_gpu * len(gpus)
    if workers > per_gpu * len(gpus):
        raise PoolConfigError(f"pool.workers is {workers} but only {len(gpus)} GPUs are available ({', '.join(gpus)}) "
                              f"with pool.lanes_per_gpu {per_gpu}: at most lanes_per_gpu workers per GPU, so that "
                              "timings never overlap")
    slots = [(f"cuda:{gpu}" + (f".{k}" if k else ""), gpu) for k in range(per_gpu) for gpu in gpus]
    return slots[:workers]
