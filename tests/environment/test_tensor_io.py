"""The safe tensor file format between evaluation processes: round trips and rejection of bad files."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from cuda_agent.environment import tensor_io
from cuda_agent.environment.tensor_io import TensorFormatError


def assert_same_tree(actual: Any, expected: Any) -> None:
    """Exact equality of nested structures, container types, dtypes and bits (NaN == NaN)."""
    assert type(actual) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        assert actual.device.type == "cpu"
        if expected.numel():
            actual_bytes = actual.reshape(-1).view(torch.uint8)
            assert torch.equal(actual_bytes, expected.reshape(-1).contiguous().view(torch.uint8))
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same_tree(a, e)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            assert_same_tree(actual[key], expected[key])
    elif isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(actual)
    else:
        assert actual == expected


def round_trip(obj: Any, tmp_path: Path) -> Any:
    path = tmp_path / "tree.bin"
    tensor_io.save(obj, path)
    return tensor_io.load(path)


@pytest.mark.parametrize("dtype", sorted(tensor_io._DTYPES.values(), key=str))
def test_round_trip_preserves_every_supported_dtype_bit_exactly(tmp_path: Path, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    if dtype.is_floating_point or dtype.is_complex:
        value = torch.randn(3, 5, generator=generator, dtype=torch.float64).to(dtype)
        if dtype.is_floating_point:
            value[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
    elif dtype is torch.bool:
        value = torch.rand(3, 5, generator=generator) > 0.5
    else:
        info = torch.iinfo(dtype)
        value = torch.randint(info.min, info.max, (3, 5), generator=generator, dtype=torch.int64).to(dtype)
    assert_same_tree(round_trip(value, tmp_path), value)


def test_round_trip_nested_tuples_lists_and_dicts(tmp_path: Path) -> None:
    tree = (
        torch.arange(6, dtype=torch.int32).reshape(2, 3),
        [torch.randn(2, dtype=torch.bfloat16), {"mask": torch.tensor([True, False]), "n": 3}],
        {"inner": ({"deep": [torch.zeros(0, 4), torch.tensor(2.5)]},), "none": None},
        "label",
        1.5,
        False,
    )
    assert_same_tree(round_trip(tree, tmp_path), tree)


def test_round_trip_zero_size_and_zero_dim_tensors(tmp_path: Path) -> None:
    tree = [torch.empty(0), torch.empty(3, 0, 2, dtype=torch.int64), torch.tensor(7), torch.tensor(-0.0)]
    result = round_trip(tree, tmp_path)
    assert_same_tree(result, tree)
    assert result[2].dim() == 0 and result[3].dim() == 0 and math.copysign(1.0, float(result[3])) == -1.0


def test_round_trip_python_scalars_including_nan_and_inf(tmp_path: Path) -> None:
    tree = [0, -3, 2**62, 0.1, float("nan"), float("inf"), True, None, "text"]
    assert_same_tree(round_trip(tree, tmp_path), tree)


def test_round_trip_makes_non_contiguous_tensors_contiguous(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base.t()[1:, ::2]
    result = round_trip(view, tmp_path)
    assert torch.equal(result, view) and result.is_contiguous()


def test_round_trip_of_a_conjugate_view_stores_its_values(tmp_path: Path) -> None:
    """``torch.conj`` is lazy: it returns a view with the conjugate bit set. Its values must be
    saved like any other tensor's (a candidate that returns one is not malformed)."""
    z = torch.randn(4, dtype=torch.complex64)
    result = round_trip(z.conj(), tmp_path)
    assert torch.equal(result, z.conj().resolve_conj())


def test_load_places_tensors_on_the_requested_device(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    tensor_io.save([torch.ones(2)], path)
    [t] = tensor_io.load(path, "cpu")
    assert t.device == torch.device("cpu")


def test_save_rejects_unsupported_leaf_types(tmp_path: Path) -> None:
    with pytest.raises(TensorFormatError, match="cannot serialise a value of type object"):
        tensor_io.save([object()], tmp_path / "x.bin")


def test_save_rejects_dicts_with_non_string_keys(tmp_path: Path) -> None:
    with pytest.raises(TensorFormatError, match="string keys"):
        tensor_io.save({1: torch.ones(1)}, tmp_path / "x.bin")


def test_save_rejects_structures_nested_too_deep(tmp_path: Path) -> None:
    tree: Any = torch.ones(1)
    for _ in range(20):
        tree = [tree]
    with pytest.raises(TensorFormatError, match="nested deeper"):
        tensor_io.save(tree, tmp_path / "x.bin")


# -- malformed files ---------------------------------------------------------------------------

def write_raw(path: Path, header: Any, body: bytes = b"", header_len: int | None = None) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + body)
    return path


def tensor_node(**overrides: Any) -> dict[str, Any]:
    node = {"t": "tensor", "dtype": "float32", "shape": [2], "offset": 0, "nbytes": 8, "device": "cpu"}
    node.update(overrides)
    return {"version": 1, "tree": node}


def test_load_rejects_file_shorter_than_the_length_prefix(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(TensorFormatError, match="too short"):
        tensor_io.load(path)


def test_load_rejects_truncated_header(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "x.bin", tensor_node(), header_len=10_000)
    with pytest.raises(TensorFormatError, match="header length 10000 is invalid"):
        tensor_io.load(path)


def test_load_rejects_oversized_header_length(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "x.bin", b"{}", header_len=2**40)
    with pytest.raises(TensorFormatError, match="header length"):
        tensor_io.load(path)


def test_load_rejects_truncated_tensor_bytes(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    tensor_io.save(torch.randn(100), path)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(TensorFormatError, match="out of range"):
        tensor_io.load(path)


def test_load_rejects_non_json_header(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "x.bin", b"\xff\xfe not json")
    with pytest.raises(TensorFormatError, match="not valid JSON"):
        tensor_io.load(path)


@pytest.mark.parametrize("header", [{"version": 2, "tree": None}, {"tree": {}}, {"version": 1}, [1, 2]])
def test_load_rejects_unknown_header_versions(tmp_path: Path, header: Any) -> None:
    with pytest.raises(TensorFormatError, match="unknown header version"):
        tensor_io.load(write_raw(tmp_path / "x.bin", header))


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (tensor_node(dtype="float128"), "unsupported dtype"),
        (tensor_node(dtype="object"), "unsupported dtype"),
        (tensor_node(shape=[-2]), "bad tensor shape"),
        (tensor_node(shape=[1.5]), "bad tensor shape"),
        (tensor_node(shape="2"), "bad tensor shape"),
        (tensor_node(nbytes=4), "inconsistent with shape"),
        (tensor_node(offset=-8), "out of range"),
        (tensor_node(offset=4), "out of range"),
        ({"version": 1, "tree": {"t": "pickle", "data": "..."}}, "unknown node type"),
        ({"version": 1, "tree": {"t": "dict", "keys": ["a", "b"], "items": []}}, "malformed dict"),
        ({"version": 1, "tree": {"t": "dict", "keys": [1], "items": [{"t": "scalar", "value": 1}]}}, "malformed dict"),
        ({"version": 1, "tree": {"t": "scalar", "value": [1, 2]}}, "malformed scalar"),
        ({"version": 1, "tree": "tensor"}, "malformed structure"),
    ],
)
def test_load_rejects_inconsistent_nodes(tmp_path: Path, node: Any, message: str) -> None:
    with pytest.raises(TensorFormatError, match=message):
        tensor_io.load(write_raw(tmp_path / "x.bin", node, body=b"\0" * 8))


def test_load_rejects_structures_nested_too_deep(tmp_path: Path) -> None:
    tree: Any = {"t": "scalar", "value": 1}
    for _ in range(40):
        tree = {"t": "list", "items": [tree]}
    with pytest.raises(TensorFormatError, match="malformed structure"):
        tensor_io.load(write_raw(tmp_path / "x.bin", {"version": 1, "tree": tree}))


@pytest.mark.parametrize(
    "node",
    [
        {"t": "tensor"},  # no dtype/shape/offset/nbytes at all
        {"t": "tensor", "dtype": ["float32"], "shape": [2], "offset": 0, "nbytes": 8},  # unhashable dtype
        {"t": "tensor", "dtype": "float32", "shape": [2], "offset": "0", "nbytes": 8},  # offset not a number
        {"t": "list", "items": 5},  # items not a list
    ],
    ids=["missing-fields", "dtype-not-a-string", "offset-not-an-int", "items-not-a-list"],
)
def test_load_reports_every_malformed_header_as_tensor_format_error(tmp_path: Path, node: Any) -> None:
    """Candidate outputs are untrusted: the reader's callers catch TensorFormatError only, so any
    other exception type escaping ``load`` turns a bad candidate file into a crash elsewhere."""
    with pytest.raises(TensorFormatError):
        tensor_io.load(write_raw(tmp_path / "x.bin", {"version": 1, "tree": node}, body=b"\0" * 8))


def test_dtype_from_name_lists_the_supported_dtypes() -> None:
    with pytest.raises(TensorFormatError, match=r"unsupported dtype 'float8'; supported: \['bfloat16'"):
        tensor_io.dtype_from_name("float8")
