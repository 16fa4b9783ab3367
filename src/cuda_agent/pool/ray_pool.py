"""The Ray pool: the local pool's pipeline with Ray actors as evaluation lanes, so a cluster of GPU
nodes serves one evaluation queue (``--backend ray --address ...``).

Each lane is one actor holding one GPU (``num_gpus=1``: Ray sets its ``CUDA_VISIBLE_DEVICES``)
that runs :class:`PoolWork` exactly as a local worker process does, one job at a time under the
GPU's lock. Builds run as Ray tasks on CPU slots. The build cache lives in ``cache_dir`` on the node
that builds; with several nodes, put ``cache_dir`` on shared storage, or each GPU node's actor
compiles what its node has not built (correct, only slower). cuda-agent must be installed on every
node. Ray is imported only when this backend is chosen.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cuda_agent.environment import EvalConfig, Verdict, timed_cpus
from cuda_agent.pool.base import EvalLane, JobRejected, LaneFailed
from cuda_agent.pool.config import PoolConfig, PoolConfigError
from cuda_agent.pool.jobs import EvalJob
from cuda_agent.pool.pipeline import LanePipeline
from cuda_agent.pool.work import PoolWork, default_staging_dir

SETUP_TIMEOUT_S = 600.0
"""Time an actor may take to be scheduled and start (a busy cluster may have to free a GPU)."""


class PoolWorkActor:
    """The body of a Ray lane: :class:`PoolWork` in an actor process."""

    def __init__(self, config: dict[str, Any], staging_dir: str) -> None:
        import ray

        timed_cpus.use_setting("off")  # actors sharing a node cannot agree on a CPU each to time on
        gpus = [str(g) for g in ray.get_gpu_ids()]
        self.detail = {"node": ray.util.get_node_ip_address(), "pid": os.getpid(), "gpu": ",".join(gpus) or None}
        self.work = PoolWork(EvalConfig.from_dict(config), Path(staging_dir),
                             f"gpu-{gpus[0]}" if gpus else None)

    def describe(self) -> dict[str, Any]:
        return self.detail

    def evaluate(self, job: dict[str, Any]) -> dict[str, Any]:
        return self.work.evaluate(EvalJob.from_json_dict(job)).to_json_dict()


def _build_in_task(config: dict[str, Any], staging_dir: str, job: dict[str, Any]) -> None:
    PoolWork(EvalConfig.from_dict(config), Path(staging_dir)).build(EvalJob.from_json_dict(job))


class RayLane(EvalLane):
    """One actor; restarted as a fresh actor after it died."""

    def __init__(self, name: str, actor_class, config: dict[str, Any], staging_dir: str, job_timeout_s: float) -> None:
        self.name = name
        self._actor_class, self._args, self._job_timeout_s = actor_class, (config, staging_dir), job_timeout_s
        self._actor = None
        self._detail: dict[str, Any] = {}

    def start(self) -> None:
        import ray

        self._actor = self._actor_class.remote(*self._args)
        self._detail = ray.get(self._actor.describe.remote(), timeout=SETUP_TIMEOUT_S)

    def evaluate(self, job: EvalJob) -> Verdict:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        try:
            data = ray.get(self._actor.evaluate.remote(job.to_json_dict()), timeout=self._job_timeout_s)
        except RayActorError as exc:
            raise LaneFailed(f"actor {self.name} on {self._detail.get('node')} died: {exc}") from None
        except GetTimeoutError:
            self.close()
            raise LaneFailed(f"actor {self.name} gave no answer within {self._job_timeout_s:g} s and was killed") from None
        except RayTaskError as exc:
            raise JobRejected(f"the evaluation raised {exc}") from None
        return Verdict.from_json_dict(data)

    def interrupt(self) -> None:
        actor = self._actor
        if actor is not None:
            import ray

            ray.kill(actor, no_restart=True)

    def close(self) -> None:
        if self._actor is not None:
            import ray

            ray.kill(self._actor, no_restart=True)
            self._actor = None

    def describe(self) -> dict[str, Any]:
        return dict(self._detail)


class RayPool(LanePipeline):
    """:class:`LanePipeline` over Ray actors. Connects to ``pool_config.address`` (none: starts a
    local Ray) unless Ray is already initialised in this process."""

    def __init__(self, config: EvalConfig, pool_config: PoolConfig) -> None:
        try:
            import ray
        except ImportError:
            raise PoolConfigError("backend 'ray' needs Ray; install it with: pip install 'cuda-agent[ray]'") from None
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(address=pool_config.address, include_dashboard=False, log_to_driver=False)
        resources = ray.cluster_resources()
        on_gpu = config.device == "cuda"
        workers = pool_config.workers or (int(resources.get("GPU", 0)) if on_gpu else 1)
        if workers < 1:
            raise PoolConfigError("device is 'cuda' but the Ray cluster has no GPU")
        actor_class = ray.remote(num_gpus=1 if on_gpu else 0, num_cpus=1, max_restarts=0)(PoolWorkActor)
        build_task = ray.remote(num_cpus=1, num_gpus=0, max_retries=1)(_build_in_task)
        staging = str(pool_config.staging_dir or default_staging_dir(config))
        config_dict = config.to_dict()
        timeout_s = config.build.timeout_s + 60

        def build(job: EvalJob) -> None:
            ray.get(build_task.remote(config_dict, staging, job.to_json_dict()), timeout=timeout_s)

        lanes = [RayLane(f"ray:{i}", actor_class, config_dict, staging, pool_config.job_timeout_s)
                 for i in range(workers)]
        compile_workers = pool_config.compile_workers or max(1, int(resources.get("CPU", 1)) - workers)
        super().__init__("ray", lanes, build, compile_workers, pool_config.queue_size or 2 * workers,
                         pool_config.max_attempts)

    def close(self, cancel_pending: bool = False) -> None:
        super().close(cancel_pending)
        if self._owns_ray:
            import ray

            ray.shutdown()
