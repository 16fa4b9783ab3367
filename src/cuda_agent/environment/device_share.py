"""A GPU shared by several evaluations at once, each holding it only for its device work.

An evaluation spends much of its wall time on the host: starting its workers, importing the task,
``torch.compile`` generating code, tearing down. On a stream of small problems (a dataset's
self-check, RL rollouts on synthesised tasks) the GPU idles through all of it. Evaluations that
share a GPU overlap that host work and take turns on the device. A measurement (timing the
baselines, timing the candidate) holds the GPU alone: no other evaluation's kernels run beside it.
The rest of the device work (loading the problem and drawing trials, loading and verifying the
candidate, tearing down) holds it beside other evaluations' untimed device work, so that their
verifying and loading overlap too, but never beside a measurement. Only ``torch.compile``'s first
calls of a baseline run unheld (code generation with one forward pass per TF32 setting at its
end): the synthesis filter compiles the same way.

Each of the evaluations plans its memory within its share of the device
(``total / evaluations``), so that evaluations that each fit can never run the GPU out of memory
together. cuDNN would not keep to it on its own: for a convolution it runs the first algorithm
whose workspace it can allocate, so on a GPU with memory free it may take most of it (a worker
held 133 GB of an H200 beside other checks, which then ran out of memory; most likely that of a
``ConvTranspose1d`` task, whose check also timed it 5x slower than the synthesis filter had) and a
different algorithm than where less is free. Workers of a shared GPU cap that
workspace (:func:`conv_workspace_cap_mb`, ``CUDNN_CONV_WSCAP_DBG``). That cap did not hold every
task (a later self-check with five lanes still saw workers of convolution tasks at 70-135 GB of an
H200, and sound tasks beside them fail for want of memory), so each worker's allocator is capped at
its evaluation's share as well (``torch.cuda.set_per_process_memory_fraction``): a task that needs
more fails in its own workers.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceShare:
    measure: Callable[[], AbstractContextManager[None]]
    """A new context manager per call that holds the GPU alone (across processes) while entered."""
    use: Callable[[], AbstractContextManager[None]]
    """A new context manager per call that holds the GPU for untimed device work: beside other
    evaluations' untimed work, never beside a measurement."""
    evaluations: int
    """How many evaluations use the GPU at once (>= 2)."""

    def __post_init__(self) -> None:
        if self.evaluations < 2:
            raise ValueError(f"a shared device has >= 2 evaluations, got {self.evaluations}")

    def memory_share(self, total_bytes: int) -> int:
        """Device bytes one evaluation may plan for."""
        return total_bytes // self.evaluations


CONV_WORKSPACE_VARIABLE = "CUDNN_CONV_WSCAP_DBG"
"""PyTorch's cap on one cuDNN convolution's workspace, in MiB."""


def conv_workspace_cap_mb(total_bytes: int, evaluations: int) -> int:
    """The cuDNN convolution workspace cap (MiB) of a worker whose GPU is shared by
    ``evaluations``: half of its share of the device, the other half being for its tensors."""
    return total_bytes // evaluations // 2 // 2**20
