"""The bench's candidate for task.py in the fast contract: y = A (B v), two matrix-vector products
in kernels/ (bench/reward_stability.py makes the workdir with kernels_cpu/ or kernels_cuda/ as
kernels/). ``WORK`` (>= 1) makes the first product compute its rows WORK times over (the last
pass in part): the same result from a slower kernel, which the bench calibrates to land near or
below a milestone's threshold."""

import torch
import torch.nn as nn

import cuda_extension  # built by the harness from kernels/*

WORK = 1.0


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, _ = cuda_extension.matvec_chain(A.contiguous(), B.contiguous(), v.contiguous(), WORK)
        return out
