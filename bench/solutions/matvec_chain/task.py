"""y = (A B) v for n x n fp32 matrices A, B and a length-n vector v, computed as the expression
reads: a matrix product, O(n^3), then a matrix-vector product. A (B v) gives the same result in
O(n^2), which neither eager PyTorch nor torch.compile does (neither reassociates a product), so
an honest kernel is clearly faster than both. bench/reward_stability.py resizes ``n``."""

import torch
import torch.nn as nn

n = 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return (A @ B) @ v


def get_inputs():
    return [torch.randn(n, n), torch.randn(n, n), torch.randn(n)]


def get_init_inputs():
    return []
