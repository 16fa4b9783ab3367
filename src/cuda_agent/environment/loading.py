"""Importing problem and solution files as fresh modules (inside worker processes only)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_file(path: Path, module_name: str) -> ModuleType:
    """Execute ``path`` as a new module registered as ``module_name`` and return it.

    The file's directory is put on ``sys.path`` first, so a workdir's ``model_new.py`` can import
    its siblings, as it would when run there.
    """
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    directory = str(path.parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec.loader.exec_module(module)
    return module


def seed_all(seed: int) -> None:
    """Seed torch's CPU and CUDA generators (KernelBench's ``set_seed``), and Python's and numpy's
    (a ``get_inputs()`` that draws with them then makes the same inputs again from the seed)."""
    import random

    import torch

    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % 2**32)
    except ImportError:
        pass
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def map_tensors(fn, tree):
    """``tree`` (nested lists, tuples and dicts) with ``fn`` applied to every tensor in it."""
    import torch

    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_tensors(fn, v) for v in tree)
    if isinstance(tree, dict):
        return {k: map_tensors(fn, v) for k, v in tree.items()}
    return tree


def to_device(tree, device):
    """Move every tensor in a (nested) list/tuple/dict to ``device``."""
    return map_tensors(lambda t: t.to(device), tree)


def clone_tree(tree):
    return map_tensors(lambda t: t.clone(), tree)


def tensors_in(tree) -> list:
    import torch

    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in tensors_in(v)]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in tensors_in(v)]
    return []


def storage_span(t) -> tuple[int, int]:
    """Byte range ``[start, end)`` of the storage behind tensor ``t``."""
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def shares_memory(t, spans: list[tuple[int, int]]) -> bool:
    """Whether the storage behind tensor ``t`` overlaps one of ``spans`` (:func:`storage_span` of
    other tensors): an output that does is a view of an input, not a fresh tensor."""
    start, end = storage_span(t)
    return bool(t.untyped_storage().nbytes()) and any(start < e and s < end for s, e in spans)
