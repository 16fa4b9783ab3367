"""RMSNorm over the last dimension with a learnable per-channel weight (a module with a parameter).

out = x * rsqrt(mean(x^2, dim=-1, keepdim=True) + eps) * weight
"""

import torch
import torch.nn as nn

batch_size = 8
seq_len = 512
hidden = 1024
eps = 1e-6


class Model(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        # Non-trivial init so that a solution that ignores the weight is caught.
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms_inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * rms_inv * self.weight


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden)]


def get_init_inputs():
    return [hidden, eps]
