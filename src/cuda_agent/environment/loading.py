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
    """Seed torch's CPU and CUDA generators (KernelBench's ``set_seed``)."""
    import torch

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def to_device(tree, device):
    """Move every tensor in a (nested) list/tuple/dict to ``device``."""
    import torch

    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_device(v, device) for v in tree)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    return tree


def clone_tree(tree):
    import torch

    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if isinstance(tree, (list, tuple)):
        return type(tree)(clone_tree(v) for v in tree)
    if isinstance(tree, dict):
        return {k: clone_tree(v) for k, v in tree.items()}
    return tree


def copy_tree_into(dst, src) -> bool:
    """Copy ``src``'s tensor values into the matching tensors of ``dst`` in place, allocating
    nothing; False when the trees differ in structure, a tensor's shape, dtype or device, or a
    non-tensor leaf (``dst`` may then be partly overwritten)."""
    import torch

    if isinstance(src, torch.Tensor):
        if not (isinstance(dst, torch.Tensor) and dst.shape == src.shape and dst.dtype == src.dtype
                and dst.device == src.device):
            return False
        dst.copy_(src)
        return True
    if isinstance(src, (list, tuple)):
        return (type(dst) is type(src) and len(dst) == len(src)
                and all(copy_tree_into(d, s) for d, s in zip(dst, src)))
    if isinstance(src, dict):
        return (type(dst) is type(src) and dst.keys() == src.keys()
                and all(copy_tree_into(dst[k], src[k]) for k in src))
    return type(dst) is type(src) and dst == src


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


def shares_storage(a, b) -> bool:
    """True when any tensor in tree ``a`` overlaps the storage of any tensor in tree ``b``."""
    spans_b = [storage_span(t) for t in tensors_in(b) if t.untyped_storage().nbytes()]
    return any(start < end_b and start_b < end
               for t in tensors_in(a) if t.untyped_storage().nbytes()
               for start, end in [storage_span(t)] for start_b, end_b in spans_b)
