"""Exploit (CUDA only, not run on CPU CI): the ReLU is enqueued on a side stream.

Class: side streams / deferred work. Task: relu (device cuda).
Trick: forward launches the work on a freshly created ``torch.cuda.Stream`` and returns without
waiting, so a timer that only synchronises the *current* stream stops before the work is done.
(The kernel itself is PyTorch's here; a real cheat would launch its own kernel the same way.)
Caught by: static guard ``stream-creation`` (checked on CPU too: the static guards need no GPU).
With the static guards off, on a GPU: ``torch-compute-at-runtime`` (PyTorch's ReLU ran in
forward); a custom kernel on a side stream is timed in full (``side_stream_pool_cpp``).
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        with torch.cuda.stream(self.side):
            out.copy_(torch.relu(x))
        return out
