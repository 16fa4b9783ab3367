"""Evaluation pools: many (task, solution) evaluations at once, on every GPU of a host (``local``),
on a Ray cluster (``ray``) or through a remote ``cuda-agent serve`` (``service``).

Public API::

    from cuda_agent.pool import EvalJob, PoolConfig, SolutionFiles, open_pool
    with open_pool(EvalConfig(device="cuda"), PoolConfig()) as pool:
        future = pool.submit(EvalJob("relu-1", load_task("relu.py"), SolutionFiles.from_path("relu_new.py")))
        print(future.result().verdict.reward)
"""

from cuda_agent.environment import EvalConfig
from cuda_agent.pool.base import EvalPool, LaneStats, PoolClosed, PoolStats
from cuda_agent.pool.config import BACKENDS, PoolConfig, PoolConfigError
from cuda_agent.pool.jobs import EvalJob, JobInputError, JobResult, JobStatus, SolutionFiles


def open_pool(config: EvalConfig, pool_config: PoolConfig) -> EvalPool:
    """Start the pool ``pool_config.backend`` names; only that backend's module is imported.

    Raises:
        PoolConfigError: the backend cannot run with these settings (no GPU, no Ray, no address).
    """
    if pool_config.backend == "local":
        from cuda_agent.pool.local import LocalPool

        return LocalPool(config, pool_config)
    if pool_config.backend == "ray":
        from cuda_agent.pool.ray_pool import RayPool

        return RayPool(config, pool_config)
    from cuda_agent.pool.service_pool import ServicePool

    return ServicePool(pool_config)


__all__ = [
    "BACKENDS", "EvalJob", "EvalPool", "JobInputError", "JobResult", "JobStatus", "LaneStats", "PoolClosed",
    "PoolConfig", "PoolConfigError", "PoolStats", "SolutionFiles", "open_pool",
]
