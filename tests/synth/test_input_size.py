"""The size bound: inputs are measured without allocating, and a task over the bound is scaled
down through its batch-like size constant only, in the worker as in process."""

from __future__ import annotations

import pytest

from cuda_agent.synth.input_size import InputSizer, SizeBoundError, bound, measure

WIDE = '''import torch
import torch.nn as nn

batch_size = 4096
dim = 1024
hidden = 512


class Model(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.proj = nn.Linear(dim, hidden)

    def forward(self, x, y):
        return self.proj(x) + y


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [dim, hidden]
'''
WIDE_BYTES = 4 * 4096 * (1024 + 512)  # 24 MiB


def test_measuring_runs_get_inputs_on_the_meta_device() -> None:
    size = measure(WIDE.replace("4096", str(1 << 40)))  # 6 PB of inputs: only a meta tensor could hold them
    assert size.shapes == ((1 << 40, 1024), (1 << 40, 512)) and size.nbytes == 4 * (1 << 40) * 1536


def test_a_task_over_the_bound_is_scaled_down_by_its_batch_size_alone() -> None:
    bounded = bound(WIDE, 5 << 20)
    assert bounded.original_nbytes == WIDE_BYTES and bounded.nbytes <= 5 << 20
    assert bounded.scaled == {"batch_size": (4096, 512)}  # /8, in powers of two: 3 MiB
    assert bounded.code == WIDE.replace("batch_size = 4096", "batch_size = 512")  # layer widths untouched
    assert measure(bounded.code).nbytes == bounded.nbytes
    within = bound(WIDE, WIDE_BYTES)
    assert within.code == WIDE and not within.resized


def test_a_task_whose_inputs_no_free_constant_scales_is_named() -> None:
    literal = "import torch\n\ndef get_inputs():\n    return [torch.randn(2048, 2048)]\n"
    with pytest.raises(SizeBoundError, match=r"16 MiB exceed the bound of 1 MiB .*\(none\)"):
        bound(literal, 1 << 20)
    with pytest.raises(SizeBoundError, match="batch_size"):
        bound(WIDE, 1000)  # batch 1 still holds 6 KiB


def test_the_worker_gives_the_same_answers_and_names_a_task_that_fails() -> None:
    with InputSizer() as sizer:
        assert sizer.bound(WIDE, 5 << 20) == bound(WIDE, 5 << 20)
        assert sizer.measure(WIDE) == measure(WIDE)
        with pytest.raises(SizeBoundError):
            sizer.bound(WIDE, 1000)
        with pytest.raises(ValueError, match="RuntimeError: no inputs here"):
            sizer.measure("def get_inputs():\n    raise RuntimeError('no inputs here')\n")
        with pytest.raises(ValueError, match="worker"):
            sizer.measure("import os\nos._exit(3)\n")
        assert sizer.measure(WIDE).nbytes == WIDE_BYTES  # a fresh worker takes the next task


def test_reading_sizes_from_the_source_agrees_with_running_get_inputs() -> None:
    from cuda_agent.synth.dataset import read_dataset
    from cuda_agent.synth.input_size import read_size

    from support import EXAMPLES

    tasks = [r for r in read_dataset(EXAMPLES / "data" / "synth-h100-sample" / "tasks.parquet") if r.source == "torch"]
    assert len(tasks) > 50 and all(read_size(r.code) == measure(r.code) for r in tasks)
    assert read_size(WIDE) == measure(WIDE)
    for changed in (WIDE.replace("torch.randn(batch_size, dim)", "torch.randn(batch_size, dim, dtype=torch.float64)"),
                    WIDE.replace("torch.randn(batch_size, hidden)", "torch.ones(batch_size, hidden)"),
                    WIDE.replace("import torch.nn as nn", "import torch.nn as nn\ntorch.set_default_dtype(torch.half)"),
                    WIDE.replace("dim = 1024", "dim = 2 ** 10")):
        assert read_size(changed) is None  # not the template: measured by running it instead
