"""The in-process integrity snapshot of the candidate worker (defence in depth)."""

from __future__ import annotations

import pytest
import torch

from cuda_agent.environment import timing
from cuda_agent.environment.integrity import HarnessSnapshot
from cuda_agent.environment.thread_starts import START_FUNCTIONS, ThreadStartLog


def test_rebinding_a_name_in_the_worker_namespace_is_seen() -> None:
    namespace = {"measure": timing.measure, "tensor_io": timing, "__name__": "__main__", "limit": 3}
    snapshot = HarnessSnapshot(namespace)
    assert snapshot.changed() == []
    namespace["measure"] = lambda *args, **kwargs: None
    namespace["limit"] = 4  # plain data is not watched
    assert snapshot.changed() == ["__main__.measure"]


@pytest.mark.parametrize("owner, attr", [(torch.Tensor, "__eq__"), (torch.UntypedStorage, "nbytes"),
                                         (torch.Tensor, "data_ptr")])
def test_patching_what_the_runtime_checks_rely_on_is_seen(monkeypatch, owner, attr) -> None:
    snapshot = HarnessSnapshot({})
    monkeypatch.setattr(owner, attr, lambda *args: 0)
    assert snapshot.changed() == [f"torch.{owner.__name__}.{attr}"]


def test_undoing_the_thread_start_stamping_is_seen(monkeypatch, stamped_threads) -> None:
    snapshot = HarnessSnapshot({})  # taken after the stamping is installed, as in the candidate worker
    module, attr = next((module, attr) for module, attr in START_FUNCTIONS if hasattr(module, attr))
    monkeypatch.setattr(module, attr, lambda *args, **kwargs: None)  # a candidate restoring an unstamped start
    assert snapshot.changed() == [f"{module.__name__}.{attr}"]
    monkeypatch.setattr(ThreadStartLog, "outlived", lambda self, since, returned: False)
    assert "cuda_agent.environment.thread_starts.ThreadStartLog" in snapshot.changed()
