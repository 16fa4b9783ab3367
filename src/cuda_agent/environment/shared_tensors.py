"""Handing a tree of tensors from one evaluation worker to the other in shared memory.

A *share* is one region of memory holding every tensor of a (nested) list/tuple/dict, plus a JSON
*header*: the tree's structure and, per tensor, its dtype, shape and byte range in the region. On
CUDA the region is a device allocation the receiver opens through its IPC handle
(:mod:`cuda_ipc`); on the CPU backend it is a file in the evaluation's shared-memory scratch that
the receiver maps. Either way the bytes are written once, by the sender, and read in place: no
tensor crosses through a host file, and a 6 GB input costs one device copy, not a round trip
through ``/dev/shm``.

Headers from the candidate's worker are untrusted. Reading one never unpickles or executes
anything: the structure is JSON checked node by node, dtypes come from an allow-list, every byte
range must lie inside the region, and a file region is opened by a bare name inside the folder
the receiver chose, never through a link.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
        torch.complex64, torch.complex128,
    )
}
_MAX_DEPTH = 16
_MAX_TENSORS = 4096
ALIGN_BYTES = 256
"""Every tensor starts at a multiple of this in its region (any dtype can view it; coalesced loads)."""
_FILE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,80}")


class ShareError(ValueError):
    """A tree cannot be shared (unsupported values), or a header does not describe a valid share."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: Any) -> torch.dtype:
    try:
        return _DTYPES[name]
    except (KeyError, TypeError):
        raise ShareError(f"unsupported dtype {name!r}; supported: {sorted(_DTYPES)}") from None


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor``'s elements in row-major order, as one uint8 tensor: a view where they
    already lie so, a copy otherwise. ``reshape(-1).view(torch.uint8)`` fails on some dense tensors:
    a size-1 dimension may keep any stride (a one-element ``diagonal`` has stride 2), and a
    flattened one keeps it too."""
    dense = tensor.contiguous()
    return dense.as_strided((dense.numel(),), (1,)).view(torch.uint8)


# -- the sender ------------------------------------------------------------------------------
class _Region:
    """Memory this process owns and another process reads."""

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError

    def write(self, offset: int, tensor: torch.Tensor) -> None:
        """Copy ``tensor``'s values (in its dtype, contiguous) to ``offset``."""
        raise NotImplementedError

    def view(self) -> tuple[Any, torch.Tensor]:
        """``(keep-alive, uint8 tensor)``: the region's bytes as this process can read them."""
        raise NotImplementedError

    def settle(self) -> None:
        """Wait until what was written can be read by another process."""

    def release(self) -> None:
        raise NotImplementedError


class _DeviceRegion(_Region):
    def __init__(self, nbytes: int) -> None:
        from cuda_agent.environment.cuda_ipc import DeviceBlock

        self._block = DeviceBlock(nbytes)

    def describe(self) -> dict[str, Any]:
        return {"kind": "cuda", "handle": self._block.handle(), "nbytes": self._block.nbytes}

    def write(self, offset: int, tensor: torch.Tensor) -> None:
        if tensor.numel():
            target = self._block.bytes[offset:offset + tensor.numel() * tensor.element_size()]
            target.view(tensor.dtype).view(tensor.shape).copy_(tensor)

    def view(self) -> tuple[Any, torch.Tensor]:
        return None, self._block.bytes

    def settle(self) -> None:
        torch.cuda.current_stream().synchronize()

    def release(self) -> None:
        self._block.free()


class _FileRegion(_Region):
    """A file in the evaluation's shared-memory scratch, written through its descriptor: the pages
    belong to the file, not to this process's resident memory."""

    def __init__(self, folder: Path, name: str, nbytes: int) -> None:
        if not _FILE_NAME.fullmatch(name):
            raise ShareError(f"bad region file name {name!r}")
        self.path = folder / name
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        os.ftruncate(self._fd, nbytes)
        self.nbytes = nbytes

    def describe(self) -> dict[str, Any]:
        return {"kind": "file", "name": self.path.name, "nbytes": self.nbytes}

    def write(self, offset: int, tensor: torch.Tensor) -> None:
        if not tensor.numel():
            return
        data = memoryview(flat_bytes(tensor.cpu()).numpy())
        while data:
            written = os.pwrite(self._fd, data, offset)
            data, offset = data[written:], offset + written

    def view(self) -> tuple[Any, torch.Tensor]:
        return _map_file(self.path.parent, self.path.name, self.nbytes)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)


class OutgoingShare:
    """A region laid out for trees shaped like ``template``; :meth:`write` copies a tree into it.

    The same share can be written again with another tree of the same layout (the timing loop's
    spare output buffers). ``folder`` and ``name``: where the region's file goes on the CPU backend.
    """

    def __init__(self, template: Any, device: str, folder: Path | None = None, name: str = "share.bin") -> None:
        self._tree, total = _layout(template, [0], 0)
        if device == "cuda":
            self._region: _Region = _DeviceRegion(total)
        else:
            if folder is None:
                raise ValueError("a CPU share needs the folder its region file goes in")
            self._region = _FileRegion(folder, name, total)
        self.header = {"version": 2, "regions": [self._region.describe()], "tree": self._tree}

    def write(self, tree: Any) -> bool:
        """Copy ``tree``'s tensors into the region; False (nothing guaranteed written) when its
        structure, a shape, a dtype or a non-tensor leaf differs from the template's. On CUDA it
        returns once the copies are done: the receiver reads the region on a stream of its own
        process, which nothing orders after this one's (handed over as soon as they were enqueued,
        the reference's inputs could be read half-written: fingerprinted so before the run and whole
        after it, the likely cause of "forward() modified input 0 in place" for a forward that
        writes nothing)."""
        written = _write_into(self._region, self._tree, tree)
        self._region.settle()
        return written

    def view(self) -> IncomingShare:
        """The share's contents as this process sees them (to compare with what was written)."""
        mapping, data = self._region.view()
        return IncomingShare(_views(self._tree, [data]), mapping)

    def release(self) -> None:
        """Free the region (the receiver must have closed its view, or keeps its own mapping)."""
        self._region.release()


def share(tree: Any, device: str, folder: Path | None = None, name: str = "share.bin") -> OutgoingShare:
    """A new share holding a copy of ``tree``.

    Raises:
        ShareError: ``tree`` holds something other than tensors of a supported dtype, numbers,
            bools, strings and None in lists, tuples and string-keyed dicts.
    """
    outgoing = OutgoingShare(tree, device, folder, name)
    outgoing.write(tree)
    return outgoing


class InPlaceShare:
    """A tree of CUDA tensors shared where they are: each tensor's allocation is opened by the
    receiver through its IPC handle, nothing is copied (a 6 GB output costs no second 6 GB). The
    share keeps the tensors alive until :meth:`release`; what the receiver reads is whatever is in
    them then, so the sender must not let them change (the candidate's worker checks that they do
    not, with fingerprints, after the reference has read them)."""

    def __init__(self, tree: Any) -> None:
        from cuda_agent.environment.cuda_ipc import allocation_range, export_handle

        self._tensors: list[torch.Tensor] = []
        handles: dict[int, int] = {}
        regions: list[dict[str, Any]] = []

        def node_of(value: Any, depth: int) -> dict[str, Any]:
            if depth > _MAX_DEPTH:
                raise ShareError(f"structure nested deeper than {_MAX_DEPTH} levels")
            if isinstance(value, dict):
                if not all(isinstance(k, str) for k in value):
                    raise ShareError("dict outputs must have string keys")
                return {"t": "dict", "keys": list(value), "items": [node_of(v, depth + 1) for v in value.values()]}
            if isinstance(value, (list, tuple)):
                return {"t": type(value).__name__, "items": [node_of(v, depth + 1) for v in value]}
            if not isinstance(value, torch.Tensor):
                return _layout(value, [0], depth)[0]  # a scalar leaf, or the error naming what it is
            tensor = value.detach().resolve_conj().resolve_neg().contiguous()
            dtype_from_name(dtype_name(tensor.dtype))
            nbytes = tensor.numel() * tensor.element_size()
            node = {"t": "tensor", "dtype": dtype_name(tensor.dtype), "shape": list(tensor.shape), "region": 0,
                    "offset": 0, "nbytes": nbytes}
            if nbytes:
                if not tensor.is_cuda:
                    raise ShareError(f"a tensor on {tensor.device} cannot be shared in place on CUDA")
                base, size = allocation_range(tensor.data_ptr())
                if base not in handles:
                    handles[base] = len(regions)
                    regions.append({"kind": "cuda", "handle": export_handle(base), "nbytes": size})
                node["region"], node["offset"] = handles[base], tensor.data_ptr() - base
                self._tensors.append(tensor)
            return node

        tree_node = node_of(tree, 0)
        self.header = {"version": 2, "regions": regions, "tree": tree_node}

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The shared tensors, in tree order (contiguous; views of the sender's outputs where those were)."""
        return list(self._tensors)

    def release(self) -> None:
        self._tensors = []


def _layout(value: Any, offset: list[int], depth: int) -> tuple[dict[str, Any], int]:
    """The header node for ``value`` with every tensor given the next aligned range; returns the
    node and the end of the last range (``offset[0]`` is advanced in place)."""
    if depth > _MAX_DEPTH:
        raise ShareError(f"structure nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, torch.Tensor):
        dtype_from_name(dtype_name(value.dtype))
        nbytes = value.numel() * value.element_size()
        start = -(-offset[0] // ALIGN_BYTES) * ALIGN_BYTES
        offset[0] = start + nbytes
        return {"t": "tensor", "dtype": dtype_name(value.dtype), "shape": list(value.shape), "region": 0,
                "offset": start, "nbytes": nbytes}, offset[0]
    if isinstance(value, (list, tuple)):
        items = [_layout(v, offset, depth + 1)[0] for v in value]
        return {"t": type(value).__name__, "items": items}, offset[0]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ShareError("dict outputs must have string keys")
        items = [_layout(v, offset, depth + 1)[0] for v in value.values()]
        return {"t": "dict", "keys": list(value), "items": items}, offset[0]
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"t": "scalar", "value": value}, offset[0]
    raise ShareError(f"cannot share a value of type {type(value).__qualname__}")


def _write_into(region: _Region, node: dict[str, Any], value: Any) -> bool:
    kind = node["t"]
    if kind == "tensor":
        if not (isinstance(value, torch.Tensor) and list(value.shape) == node["shape"]
                and dtype_name(value.dtype) == node["dtype"]):
            return False
        region.write(node["offset"], value.detach().resolve_conj().resolve_neg())
        return True
    if kind in ("list", "tuple"):
        return (type(value).__name__ == kind and len(value) == len(node["items"])
                and all(_write_into(region, n, v) for n, v in zip(node["items"], value)))
    if kind == "dict":
        return (isinstance(value, dict) and list(value) == node["keys"]
                and all(_write_into(region, n, value[k]) for n, k in zip(node["items"], node["keys"])))
    expected = node["value"]
    return type(value) is type(expected) and (value == expected or value != value)


# -- the receiver ----------------------------------------------------------------------------
@dataclass
class IncomingShare:
    """Another worker's share, mapped: ``tree`` holds tensors that view its region in place."""

    tree: Any
    _mapping: Any

    def close(self) -> None:
        """Unmap the regions (tensors of ``tree`` still held elsewhere keep a CPU mapping alive;
        on CUDA they must be gone)."""
        self.tree = None
        mappings, self._mapping = self._mapping, None
        for mapping in mappings if isinstance(mappings, list) else [mappings]:
            if isinstance(mapping, mmap.mmap):
                _close_map(mapping)
            elif mapping is not None:
                mapping.close()


def open_share(header: Any, device: str, folder: Path | None = None) -> IncomingShare:
    """Map the share ``header`` describes. A CPU share's region file is looked up by name in
    ``folder``; its pages are mapped copy-on-write, so writing into the tensors never reaches the
    sender's file.

    Raises:
        ShareError: the header is malformed, names a region that does not exist or is too small,
            or puts a tensor outside its region.
    """
    if not isinstance(header, dict) or header.get("version") != 2:
        raise ShareError("share header: unknown version")
    regions = header.get("regions")
    if (not isinstance(regions, list) or len(regions) > _MAX_TENSORS
            or not all(isinstance(r, dict) and type(r.get("nbytes")) is int and r["nbytes"] >= 0 for r in regions)):
        raise ShareError("share header: malformed regions")
    _check_ranges(header.get("tree"), [r["nbytes"] for r in regions])
    mappings: list[Any] = []
    try:
        data = [_open_region(region, device, folder, mappings) for region in regions]
        return IncomingShare(_views(header["tree"], data), mappings)
    except BaseException:
        IncomingShare(None, mappings).close()
        raise


def _open_region(region: dict[str, Any], device: str, folder: Path | None, mappings: list[Any]) -> torch.Tensor:
    """The bytes of one region, mapped (the mapping joins ``mappings``, for closing)."""
    nbytes = region["nbytes"]
    if region.get("kind") == "cuda" and device == "cuda":
        from cuda_agent.environment.cuda_ipc import CudaIpcError, MappedBlock

        try:
            mapping: Any = MappedBlock(region.get("handle"))
        except CudaIpcError as exc:
            raise ShareError(f"share header: cannot open the device region: {exc}") from None
        mappings.append(mapping)
        if mapping.nbytes < nbytes:
            raise ShareError(f"share header: the device region holds {mapping.nbytes} bytes, not {nbytes}")
        return mapping.bytes[:nbytes]
    if region.get("kind") == "file" and device != "cuda":
        if folder is None:
            raise ValueError("a CPU share is opened in the folder its region file is in")
        mapping, data = _map_file(folder, region.get("name"), nbytes)
        mappings.append(mapping)
        return data
    raise ShareError(f"share header: region kind {str(region.get('kind'))[:40]!r} cannot be opened on {device}")


def _map_file(folder: Path, name: Any, nbytes: int) -> tuple[mmap.mmap | None, torch.Tensor]:
    if not isinstance(name, str) or not _FILE_NAME.fullmatch(name) or name in (".", ".."):
        raise ShareError(f"share header: bad region file name {str(name)[:80]!r}")
    try:
        fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ShareError(f"share header: cannot open region file {name!r}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size < nbytes:
            raise ShareError(f"share header: region file {name!r} is not a regular file of {nbytes} bytes")
        if nbytes == 0:
            return None, torch.empty(0, dtype=torch.uint8)
        mapping = mmap.mmap(fd, nbytes, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    return mapping, torch.frombuffer(mapping, dtype=torch.uint8)


def _close_map(mapping: mmap.mmap) -> None:
    try:
        mapping.close()
    except BufferError:  # tensors over it are still alive elsewhere: unmapped when they die
        pass


def _check_ranges(node: Any, region_bytes: list[int], depth: int = 0, count: list[int] | None = None) -> None:
    """Every node well formed and every tensor's bytes inside its region (before any mapping)."""
    count = count if count is not None else [0]
    if depth > _MAX_DEPTH or not isinstance(node, dict):
        raise ShareError("share header: malformed structure")
    kind = node.get("t")
    if kind == "tensor":
        count[0] += 1
        if count[0] > _MAX_TENSORS:
            raise ShareError(f"share header: more than {_MAX_TENSORS} tensors")
        dtype = dtype_from_name(node.get("dtype"))
        shape, offset, nbytes = node.get("shape"), node.get("offset"), node.get("nbytes")
        if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):
            raise ShareError(f"share header: bad tensor shape {str(shape)[:80]}")
        numel = 1
        for size in shape:
            numel *= size
        element = torch.empty((), dtype=dtype).element_size()
        if type(offset) is not int or type(nbytes) is not int or offset < 0 or offset % element:
            raise ShareError("share header: bad tensor offset")
        region = node.get("region")
        if nbytes and (type(region) is not int or not 0 <= region < len(region_bytes)):
            raise ShareError("share header: a tensor names no region of the share")
        if nbytes != numel * element or (nbytes and offset + nbytes > region_bytes[region]):
            raise ShareError("share header: tensor bytes out of range or inconsistent with its shape")
    elif kind in ("list", "tuple", "dict"):
        items = node.get("items")
        if not isinstance(items, list):
            raise ShareError("share header: malformed structure")
        if kind == "dict":
            keys = node.get("keys")
            if not isinstance(keys, list) or len(keys) != len(items) or not all(isinstance(k, str) for k in keys):
                raise ShareError("share header: malformed dict")
        for item in items:
            _check_ranges(item, region_bytes, depth + 1, count)
    elif kind == "scalar":
        value = node.get("value")
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise ShareError("share header: malformed scalar")
    else:
        raise ShareError(f"share header: unknown node type {str(kind)[:40]!r}")


def _views(node: dict[str, Any], data: list[torch.Tensor]) -> Any:
    """The tree a (checked) header node describes, its tensors viewing their regions' bytes
    (``data``, one ``uint8`` tensor per region) in place."""
    kind = node["t"]
    if kind == "tensor":
        dtype = dtype_from_name(node["dtype"])
        if node["nbytes"] == 0:
            return torch.empty(node["shape"], dtype=dtype, device=data[0].device if data else "cpu")
        region = data[node["region"]]
        return region[node["offset"]:node["offset"] + node["nbytes"]].view(dtype).view(node["shape"])
    if kind in ("list", "tuple"):
        items = [_views(item, data) for item in node["items"]]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return dict(zip(node["keys"], (_views(item, data) for item in node["items"])))
    return node["value"]
