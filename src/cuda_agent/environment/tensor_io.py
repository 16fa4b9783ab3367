"""A safe file format for nested tensor structures passed between evaluation processes.

Candidate outputs cross from an untrusted process into a trusted one, so the format is JSON for
structure plus raw little-endian bytes for data: reading it never unpickles or executes anything.
Layout: 8-byte little-endian header length, the UTF-8 JSON header, then the tensor bytes.
"""

from __future__ import annotations

import json
import struct
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
_MAX_HEADER_BYTES = 16 * 1024 * 1024
_MAX_DEPTH = 16


class TensorFormatError(ValueError):
    """A tensor file is malformed or uses something the format does not allow."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise TensorFormatError(f"unsupported dtype {name!r}; supported: {sorted(_DTYPES)}") from None


def save(obj: Any, path: Path) -> None:
    """Write a tensor, scalar, or (nested) list/tuple/dict of them to ``path``.

    Raises:
        TensorFormatError: for leaves that are not tensors, numbers, bools, strings or None.
    """
    blobs: list[bytes] = []
    offset = 0

    def encode(value: Any, depth: int) -> dict[str, Any]:
        nonlocal offset
        if depth > _MAX_DEPTH:
            raise TensorFormatError(f"structure nested deeper than {_MAX_DEPTH} levels")
        if isinstance(value, torch.Tensor):
            cpu = value.detach().resolve_conj().resolve_neg().to("cpu").contiguous()
            raw = cpu.reshape(-1).view(torch.uint8).numpy().tobytes() if cpu.numel() else b""
            node = {"t": "tensor", "dtype": dtype_name(cpu.dtype), "shape": list(cpu.shape),
                    "offset": offset, "nbytes": len(raw), "device": str(value.device)}
            blobs.append(raw)
            offset += len(raw)
            return node
        if isinstance(value, (list, tuple)):
            return {"t": type(value).__name__, "items": [encode(v, depth + 1) for v in value]}
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise TensorFormatError("dict outputs must have string keys")
            return {"t": "dict", "keys": list(value), "items": [encode(v, depth + 1) for v in value.values()]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"t": "scalar", "value": value}
        raise TensorFormatError(f"cannot serialise a value of type {type(value).__qualname__}")

    header = json.dumps({"version": 1, "tree": encode(obj, 0)}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for blob in blobs:
            f.write(blob)


def load(path: Path, device: str | torch.device = "cpu") -> Any:
    """Read a structure written by :func:`save`, placing tensors on ``device``.

    Raises:
        TensorFormatError: if the file is truncated, malformed or inconsistent.
    """
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise TensorFormatError(f"{path}: file too short for a header")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > _MAX_HEADER_BYTES or 8 + header_len > len(data):
        raise TensorFormatError(f"{path}: header length {header_len} is invalid")
    try:
        header = json.loads(data[8 : 8 + header_len])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TensorFormatError(f"{path}: header is not valid JSON ({exc})") from None
    body = memoryview(data)[8 + header_len :]
    if not isinstance(header, dict) or header.get("version") != 1 or "tree" not in header:
        raise TensorFormatError(f"{path}: unknown header version")
    try:
        return _decode(header["tree"], body, torch.device(device), 0, path)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, TensorFormatError):
            raise
        raise TensorFormatError(f"{path}: malformed header ({type(exc).__name__}: {exc})") from None


def _decode(node: Any, body: memoryview, device: torch.device, depth: int, path: Path) -> Any:
    if depth > _MAX_DEPTH or not isinstance(node, dict):
        raise TensorFormatError(f"{path}: malformed structure")
    kind = node.get("t")
    if kind == "tensor":
        dtype = dtype_from_name(node["dtype"])
        shape = node["shape"]
        offset, nbytes = node["offset"], node["nbytes"]
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise TensorFormatError(f"{path}: bad tensor shape {shape!r}")
        numel = 1
        for s in shape:
            numel *= s
        element_size = torch.empty((), dtype=dtype).element_size()
        if nbytes != numel * element_size or offset < 0 or offset + nbytes > len(body):
            raise TensorFormatError(f"{path}: tensor bytes out of range or inconsistent with shape")
        if numel == 0:
            return torch.empty(shape, dtype=dtype, device=device)
        flat = torch.frombuffer(bytearray(body[offset : offset + nbytes]), dtype=dtype)
        return flat.reshape(shape).to(device)
    if kind in ("list", "tuple"):
        items = [_decode(v, body, device, depth + 1, path) for v in node.get("items", [])]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        keys = node.get("keys", [])
        values = [_decode(v, body, device, depth + 1, path) for v in node.get("items", [])]
        if len(keys) != len(values) or not all(isinstance(k, str) for k in keys):
            raise TensorFormatError(f"{path}: malformed dict")
        return dict(zip(keys, values))
    if kind == "scalar":
        value = node.get("value")
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise TensorFormatError(f"{path}: malformed scalar")
        return value
    raise TensorFormatError(f"{path}: unknown node type {kind!r}")
