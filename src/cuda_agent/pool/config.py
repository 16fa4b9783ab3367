"""Configuration of an evaluation pool (the backend, its workers, its queue and retries)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BACKENDS = ("local", "ray", "service")
"""``local``: worker processes on this host; ``ray``: Ray actors on a cluster; ``service``: a
remote ``cuda-agent serve``. Kept here (not in a registry) so that choosing one never imports it."""


class PoolConfigError(ValueError):
    """A pool configuration value is invalid; the message names the field and what is allowed."""


@dataclass(frozen=True)
class PoolConfig:
    backend: str = "local"
    """Where evaluations run: one of ``BACKENDS``."""
    address: str | None = None
    """``ray``: the cluster address (``auto``, ``ray://host:10001``; none starts a local Ray);
    ``service``: the base URL of a ``cuda-agent serve`` (required)."""
    token: str | None = None
    """``service``: the bearer token the service expects."""
    workers: int = 0
    """Evaluation workers. 0: one per visible GPU on ``cuda`` (all GPUs of the host, or of the Ray
    cluster; ``lanes_per_gpu`` per GPU with ``local``), 1 on ``cpu`` (CPU timings of concurrent
    evaluations would disturb each other); ``service``: requests in flight (0: 64)."""
    lanes_per_gpu: int = 1
    """``local`` on ``cuda``: evaluations running at once on each GPU. Above 1 they overlap their
    host work (starting workers, importing the task, compiling) and take turns for their device
    work, each holding the GPU for it (``environment/device_share.py``), and each plans its memory
    within 1/``lanes_per_gpu`` of the GPU: for streams of problems far smaller than the GPU."""
    prestart_slots: int | None = None
    """``local``: worker slots each lane keeps started and warm ahead of its evaluations
    (``environment.Prestarter``); None: the device's default (3 on a CUDA host of 12 or more
    cores) divided among a GPU's lanes, so one a lane at 3 lanes or more; 0: none."""
    gpus: tuple[str, ...] = ()
    """``local`` on ``cuda``: the GPUs to use, as ``CUDA_VISIBLE_DEVICES`` entries (indices or
    UUIDs); empty: every GPU this process can see."""
    compile_workers: int = 0
    """Builds run at once ahead of evaluation (each in its own compiler process, no GPU); 0: one per
    CPU core."""
    queue_size: int = 0
    """Built jobs waiting for an evaluation worker before the compile stage pauses; 0: 2 x workers."""
    max_attempts: int = 2
    """Evaluation attempts per job: a worker that dies mid-job costs one, and the job goes back to
    the queue; after the last, the job is answered with an error (never dropped)."""
    job_timeout_s: float = 3600.0
    """A worker that has not answered one job in this long is killed (counted as a worker death).
    Evaluations bound their own phases (``limits``, ``build.timeout_s``); this catches a stuck worker."""
    staging_dir: Path | None = None
    """Where jobs' solution files are written before building (content-addressed); default
    ``<cache_dir>/staged``."""

    def __post_init__(self) -> None:
        checks = [
            (self.backend in BACKENDS, f"pool.backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}"),
            (self.workers >= 0, f"pool.workers must be >= 0, got {self.workers}"),
            (self.lanes_per_gpu >= 1, f"pool.lanes_per_gpu must be >= 1, got {self.lanes_per_gpu}"),
            (self.lanes_per_gpu == 1 or self.backend == "local",
             f"pool.lanes_per_gpu is for backend 'local' (got {self.lanes_per_gpu} with {self.backend!r})"),
            (self.prestart_slots is None or self.prestart_slots >= 0,
             f"pool.prestart_slots must be >= 0 (or unset for the default), got {self.prestart_slots}"),
            (self.compile_workers >= 0, f"pool.compile_workers must be >= 0, got {self.compile_workers}"),
            (self.queue_size >= 0, f"pool.queue_size must be >= 0, got {self.queue_size}"),
            (self.max_attempts >= 1, f"pool.max_attempts must be >= 1, got {self.max_attempts}"),
            (self.job_timeout_s > 0, f"pool.job_timeout_s must be > 0, got {self.job_timeout_s}"),
            (self.backend != "service" or bool(self.address),
             "pool.address must be the service's URL (e.g. http://gpu-host:8000) with backend 'service'"),
            (all(isinstance(g, str) and g.strip() for g in self.gpus),
             f"pool.gpus must be CUDA_VISIBLE_DEVICES entries such as '0' or 'GPU-<uuid>', got {self.gpus!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise PoolConfigError(message)
