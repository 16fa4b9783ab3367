"""Worker side of a local pool lane: ``python -m cuda_agent.pool.process_worker``.

One long-lived process per GPU (``CUDA_VISIBLE_DEVICES`` set by the parent) or CPU lane. It speaks
the environment's worker protocol (:mod:`cuda_agent.environment.worker`) with two requests:
``setup`` (the evaluation config, the staging folder, the device lock and how many lanes share
the GPU) and ``evaluate`` (one job,
answered with its verdict's JSON). It never imports task or candidate code itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cuda_agent.environment import EvalConfig
from cuda_agent.environment.worker import serve
from cuda_agent.pool.jobs import EvalJob
from cuda_agent.pool.work import PoolWork


class _Handlers:
    def __init__(self) -> None:
        self.work: PoolWork | None = None

    def setup(self, message: dict[str, Any]) -> dict[str, Any]:
        self.work = PoolWork(EvalConfig.from_dict(message["config"]), Path(message["staging_dir"]),
                             message.get("device_lock"), message.get("prestart_slots"),
                             lanes_on_gpu=message.get("lanes_on_gpu", 1))
        return {}

    def evaluate(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.work is None:
            raise RuntimeError("'evaluate' before 'setup'")
        return {"verdict": self.work.evaluate(EvalJob.from_json_dict(message["job"])).to_json_dict()}


def main() -> None:
    handlers = _Handlers()
    try:
        serve({"setup": handlers.setup, "evaluate": handlers.evaluate})
    finally:
        if handlers.work is not None:
            handlers.work.close()


if __name__ == "__main__":
    main()
