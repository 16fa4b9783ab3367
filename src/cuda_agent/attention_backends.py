"""Scaled-dot-product attention kept off cuDNN, for models whose sequence lengths change call to call.

PyTorch's cuDNN attention builds an execution plan for every new shape. Decoding grows the key
length by one each step, and training batches are padded to a different length each time, so
nearly every call builds a plan: on an H100 (torch 2.11, a 4-layer model in bfloat16) a decoding
step took 52 ms with cuDNN attention and 4-5 ms without. The flash, memory-efficient and math
kernels need no plan. Only CUDA is affected; elsewhere this does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def without_cudnn_attention(device_type: str) -> Iterator[None]:
    """Runs the block with attention on the flash, memory-efficient or math kernels (``device_type``
    ``cuda``); restores the previous choice afterwards."""
    if device_type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield
