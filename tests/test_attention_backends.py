"""``without_cudnn_attention``: CUDA attention leaves cuDNN (which builds a plan per new length) for
the block only; other devices are untouched. The backend switches are process flags, so this runs
without a GPU."""

import torch

from cuda_agent.attention_backends import without_cudnn_attention


def _backends() -> tuple[bool, bool, bool, bool]:
    cuda = torch.backends.cuda
    return cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled()


def test_cuda_attention_leaves_cudnn_for_the_block_and_gets_it_back():
    before = _backends()
    with without_cudnn_attention("cuda"):
        assert _backends() == (False, True, True, True)
    assert _backends() == before


def test_other_devices_keep_every_backend():
    before = _backends()
    with without_cudnn_attention("cpu"):
        assert _backends() == before
