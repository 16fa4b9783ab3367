"""``cuda-agent serve``: start the evaluation service on this host's GPUs (or a Ray cluster)."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Optional

import typer

from cuda_agent.cli_support import PRESET_HELP, build_eval_config, err_console, fail_usage
from cuda_agent.environment import POLICIES
from cuda_agent.pool import PoolConfig, PoolConfigError

TOKEN_ENV = "CUDA_AGENT_SERVE_TOKEN"


def _token(token_file: Optional[Path]) -> Optional[str]:
    if token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    try:
        return token_file.read_text().strip() or None
    except OSError as exc:
        fail_usage(f"{token_file}: cannot read the token file ({exc})")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _redactor(eval_config):
    from cuda_agent.environment.slots import default_scratch_root
    from cuda_agent.pool.work import default_staging_dir
    from cuda_agent.serve.redact import PathRedactor

    roots = {Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), default_scratch_root()}
    if eval_config.scratch_dir:
        roots.add(Path(eval_config.scratch_dir))
    return PathRedactor(default_staging_dir(eval_config), eval_config.cache_dir, tuple(sorted(roots)))


def serve_command(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, help="TCP port."),
    state_dir: Path = typer.Option(Path("serve-state"), help="Folder of the persistent job queue (jobs.sqlite)."),
    token_file: Optional[Path] = typer.Option(None, help=f"File holding the bearer token [default: ${TOKEN_ENV}]."),
    allow_anonymous: bool = typer.Option(False, "--allow-anonymous", help="Accept requests without a token."),
    max_request_mb: float = typer.Option(8.0, help="Largest request body (413 above)."),
    max_batch: int = typer.Option(1024, help="Most jobs per batch request."),
    device: Optional[str] = typer.Option(None, help="cuda or cpu (default: cuda if a GPU is visible, else cpu)."),
    precision: Optional[str] = typer.Option(None, help=f"Precision policy: {', '.join(POLICIES.names())}."),
    compile_baseline: Optional[bool] = typer.Option(None, "--compile-baseline/--no-compile-baseline",
                                                    help="Time torch.compile too (needed for reward 3)."),
    config: Optional[Path] = typer.Option(None, help="YAML config with sections build, verify, timing, limits."),
    preset: Optional[str] = typer.Option(None, help=PRESET_HELP),
    backend: str = typer.Option("local", help="Where evaluations run: local (this host's GPUs) or ray."),
    address: Optional[str] = typer.Option(None, help="Ray cluster address (backend ray)."),
    workers: int = typer.Option(0, help="Evaluation workers (0: one per GPU; 1 on cpu)."),
    gpus: Optional[str] = typer.Option(None, help="GPUs to use, e.g. 0,1 (default: all visible)."),
    compile_workers: int = typer.Option(0, help="Concurrent builds ahead of evaluation (0: one per CPU core)."),
) -> None:
    """Serve evaluations over HTTP: submit (task, solution) jobs, get verdicts (docs/serve.md).

    Accepted jobs are kept in STATE_DIR/jobs.sqlite until answered: after a restart, the jobs still
    queued are evaluated first.
    """
    try:
        import uvicorn

        from cuda_agent.serve.app import create_app
    except ImportError as exc:
        fail_usage(f"the service needs FastAPI and uvicorn ({exc}); install them with: pip install 'cuda-agent[serve]'")
    from cuda_agent.pool import open_pool
    from cuda_agent.serve.config import JOBS_FILE, ServeConfig, ServeConfigError
    from cuda_agent.serve.queue import JobQueue
    from cuda_agent.serve.service import EvalService
    from cuda_agent.serve.state_lock import StateDirBusy, StateDirLock

    if backend not in ("local", "ray"):
        fail_usage(f"--backend must be local or ray for a service, got {backend!r}")
    if allow_anonymous and not _is_loopback(host):
        err_console.print(f"warning: --allow-anonymous on {host}: anyone who can reach this port may submit code to "
                          "run on this machine; use a bearer token unless the network is trusted", style="yellow",
                          markup=False)
    eval_config = build_eval_config(device, config, precision, compile_baseline=compile_baseline, preset=preset)
    try:
        lock = StateDirLock(state_dir)  # before any worker starts: a second instance fails fast
    except (StateDirBusy, OSError) as exc:
        fail_usage(str(exc))
    try:
        serve_config = ServeConfig(state_dir=state_dir, token=_token(token_file), allow_anonymous=allow_anonymous,
                                   max_request_mb=max_request_mb, max_batch=max_batch)
        pool_config = PoolConfig(backend=backend, address=address, workers=workers, compile_workers=compile_workers,
                                 gpus=tuple(g.strip() for g in gpus.split(",")) if gpus else ())
        pool = open_pool(eval_config, pool_config)
    except (ServeConfigError, PoolConfigError) as exc:
        fail_usage(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    owner = f"pid {os.getpid()} on {socket.gethostname()} ({uuid.uuid4().hex[:8]})"
    service = EvalService(JobQueue(state_dir / JOBS_FILE, owner), pool, _redactor(eval_config))
    lanes = ", ".join(lane.name for lane in pool.stats().lanes)
    err_console.print(f"serving on http://{host}:{port} ({eval_config.device}; workers {lanes}; jobs in "
                      f"{state_dir / JOBS_FILE})")
    try:
        uvicorn.run(create_app(service, serve_config), host=host, port=port, log_level="info")
    finally:
        service.close()  # when uvicorn never started (port taken), its shutdown did not close the pool
        lock.release()
