"""Outputs whose strides ``reshape(-1).view(torch.uint8)`` refuses are still judged.

A dense tensor may keep any stride on a size-1 dimension: ``torch.linalg.diagonal`` of a
``(1, 1, 1, 1)`` tensor has stride 2 on its last one. A synthesised task that ends so failed its
self-check on an H100 as the candidate's runtime error, raised by the harness fingerprinting the
output, not by the task.
"""

from __future__ import annotations

import torch

from cuda_agent.environment import Status
from cuda_agent.environment.fingerprint import FingerprintKey
from cuda_agent.environment.shared_tensors import flat_bytes

_DIAGONAL_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Ends on a one-element diagonal: a dense output whose last stride is 2."""

    def forward(self, x):
        return torch.linalg.diagonal(torch.norm_except_dim(torch.tanh(x)))


def get_inputs():
    return [torch.randn(1, 4, 8, 8)]


def get_init_inputs():
    return []
'''


def one_element_diagonal() -> torch.Tensor:
    diagonal = torch.linalg.diagonal(torch.full((1, 1, 1, 1), 2.5))
    assert diagonal.is_contiguous() and diagonal.stride(-1) == 2
    return diagonal


def test_flat_bytes_reads_a_dense_tensor_whatever_its_size_one_strides() -> None:
    diagonal = one_element_diagonal()
    assert torch.equal(flat_bytes(diagonal), torch.tensor([2.5]).view(torch.uint8))
    strided = torch.arange(24.0).reshape(4, 6).t()[1:, ::2]
    assert torch.equal(flat_bytes(strided), strided.contiguous().reshape(-1).view(torch.uint8))
    assert flat_bytes(torch.empty(0, 3)).numel() == 0


def test_a_fingerprint_of_such_a_tensor_is_that_of_its_values() -> None:
    key = FingerprintKey("cpu")
    diagonal = one_element_diagonal()
    assert key(diagonal) == key(torch.tensor([[[2.5]]])) != key(torch.tensor([[[2.0]]]))


def test_a_task_ending_on_a_one_element_diagonal_passes_its_self_check(run_self_check) -> None:
    verdict = run_self_check("diagonal", _DIAGONAL_TASK)
    assert verdict.status is Status.CORRECT, verdict.error
