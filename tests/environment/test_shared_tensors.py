"""Tensors shared between the evaluation's workers: round trips, in-place views, and the refusal
of every malformed header (the candidate's headers are untrusted)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from cuda_agent.environment import shared_tensors
from cuda_agent.environment.shared_tensors import OutgoingShare, ShareError, open_share, share


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
    return open_share(share(obj, "cpu", tmp_path, "tree.bin").header, "cpu", tmp_path).tree


@pytest.mark.parametrize("dtype", sorted(shared_tensors._DTYPES.values(), key=str))
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


def test_the_receiver_views_the_region_in_place_and_its_writes_stay_private(tmp_path: Path) -> None:
    """The receiver maps the region copy-on-write: what the candidate writes into its inputs never
    reaches the file the reference wrote (nor another mapping of it)."""
    sent = share([torch.arange(4.0)], "cpu", tmp_path, "inputs.bin")
    [received] = open_share(sent.header, "cpu", tmp_path).tree
    received.fill_(-1.0)
    [again] = open_share(sent.header, "cpu", tmp_path).tree
    assert torch.equal(again, torch.arange(4.0))


def test_a_share_is_written_again_in_place_for_trees_of_the_same_layout(tmp_path: Path) -> None:
    spare = OutgoingShare([torch.zeros(3), 2], "cpu", tmp_path, "spare.bin")
    assert spare.write([torch.ones(3), 2])
    assert torch.equal(open_share(spare.header, "cpu", tmp_path).tree[0], torch.ones(3))
    assert not spare.write([torch.ones(4), 2])  # shape
    assert not spare.write([torch.ones(3, dtype=torch.float64), 2])  # dtype
    assert not spare.write([torch.ones(3), 3])  # non-tensor leaf
    assert not spare.write((torch.ones(3), 2))  # container type


def test_tensors_start_aligned_in_the_region(tmp_path: Path) -> None:
    header = share([torch.ones(3, dtype=torch.int8), torch.ones(5)], "cpu", tmp_path, "x.bin").header
    assert [item["offset"] % shared_tensors.ALIGN_BYTES for item in header["tree"]["items"]] == [0, 0]


def test_release_removes_the_region_file(tmp_path: Path) -> None:
    sent = share([torch.ones(2)], "cpu", tmp_path, "x.bin")
    sent.release()
    assert not (tmp_path / "x.bin").exists()


def test_share_rejects_unsupported_leaf_types(tmp_path: Path) -> None:
    with pytest.raises(ShareError, match="cannot share a value of type object"):
        share([object()], "cpu", tmp_path)


def test_share_rejects_dicts_with_non_string_keys(tmp_path: Path) -> None:
    with pytest.raises(ShareError, match="string keys"):
        share({1: torch.ones(1)}, "cpu", tmp_path)


def test_share_rejects_structures_nested_too_deep(tmp_path: Path) -> None:
    tree: Any = torch.ones(1)
    for _ in range(20):
        tree = [tree]
    with pytest.raises(ShareError, match="nested deeper"):
        share(tree, "cpu", tmp_path)


# -- malformed headers (the candidate's are untrusted) ---------------------------------------------

def region_file(folder: Path, nbytes: int = 8, name: str = "r.bin") -> dict[str, Any]:
    (folder / name).write_bytes(b"\0" * nbytes)
    return {"kind": "file", "name": name, "nbytes": nbytes}


def header_with(tree: Any, region: Any) -> dict[str, Any]:
    return {"version": 2, "regions": [region], "tree": tree}


def tensor_node(**overrides: Any) -> dict[str, Any]:
    node = {"t": "tensor", "dtype": "float32", "shape": [2], "region": 0, "offset": 0, "nbytes": 8}
    node.update(overrides)
    return node


@pytest.mark.parametrize("header", [{"version": 1, "tree": None}, {"tree": {}}, [1, 2], None])
def test_open_rejects_unknown_header_versions(tmp_path: Path, header: Any) -> None:
    with pytest.raises(ShareError, match="unknown version"):
        open_share(header, "cpu", tmp_path)


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (tensor_node(dtype="float128"), "unsupported dtype"),
        (tensor_node(dtype="object"), "unsupported dtype"),
        (tensor_node(dtype=["float32"]), "unsupported dtype"),
        (tensor_node(shape=[-2]), "bad tensor shape"),
        (tensor_node(shape=[1.5]), "bad tensor shape"),
        (tensor_node(shape="2"), "bad tensor shape"),
        (tensor_node(nbytes=4), "inconsistent with its shape"),
        (tensor_node(offset=-256), "bad tensor offset"),
        (tensor_node(offset=2), "bad tensor offset"),
        (tensor_node(offset="0"), "bad tensor offset"),
        (tensor_node(offset=256), "out of range"),
        (tensor_node(offset=4), "out of range"),
        (tensor_node(region=1), "names no region"),
        (tensor_node(region=-1), "names no region"),
        (tensor_node(region="0"), "names no region"),
        (tensor_node(shape=[3], nbytes=12), "out of range"),
        ({"t": "tensor"}, "unsupported dtype"),
        ({"t": "pickle", "data": "..."}, "unknown node type"),
        ({"t": "dict", "keys": ["a", "b"], "items": []}, "malformed dict"),
        ({"t": "dict", "keys": [1], "items": [{"t": "scalar", "value": 1}]}, "malformed dict"),
        ({"t": "list", "items": 5}, "malformed structure"),
        ({"t": "scalar", "value": [1, 2]}, "malformed scalar"),
        ("tensor", "malformed structure"),
    ],
)
def test_open_rejects_inconsistent_nodes(tmp_path: Path, node: Any, message: str) -> None:
    with pytest.raises(ShareError, match=message):
        open_share(header_with(node, region_file(tmp_path)), "cpu", tmp_path)


def test_open_rejects_structures_nested_too_deep(tmp_path: Path) -> None:
    tree: Any = {"t": "scalar", "value": 1}
    for _ in range(40):
        tree = {"t": "list", "items": [tree]}
    with pytest.raises(ShareError, match="malformed structure"):
        open_share(header_with(tree, region_file(tmp_path)), "cpu", tmp_path)


@pytest.mark.parametrize("name", ["../escape.bin", "/etc/passwd", "..", "a b", "", 7])
def test_open_looks_region_files_up_by_bare_name_only(tmp_path: Path, name: Any) -> None:
    region = {"kind": "file", "name": name, "nbytes": 8}
    with pytest.raises(ShareError, match="bad region file name"):
        open_share(header_with(tensor_node(), region), "cpu", tmp_path)


def test_open_refuses_a_region_file_that_is_a_link(tmp_path: Path) -> None:
    """The candidate owns its outputs folder: a link there must not make the trusted reference map
    another file (the task, a cache, /etc/shadow)."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\1" * 8)
    os.symlink(secret, tmp_path / "outputs_0.bin")
    region = {"kind": "file", "name": "outputs_0.bin", "nbytes": 8}
    with pytest.raises(ShareError, match="cannot open region file"):
        open_share(header_with(tensor_node(), region), "cpu", tmp_path)


def test_open_refuses_a_region_file_smaller_than_its_header_says(tmp_path: Path) -> None:
    region = region_file(tmp_path, nbytes=4)
    region["nbytes"] = 8
    with pytest.raises(ShareError, match="not a regular file of 8 bytes"):
        open_share(header_with(tensor_node(), region), "cpu", tmp_path)


@pytest.mark.parametrize("region", [{"kind": "cuda", "handle": "00" * 64, "nbytes": 8},
                                    {"kind": "mystery", "nbytes": 8}, {"kind": "file", "nbytes": -1}, "file"])
def test_open_refuses_regions_it_cannot_open_on_the_cpu(tmp_path: Path, region: Any) -> None:
    with pytest.raises(ShareError):
        open_share(header_with(tensor_node(), region), "cpu", tmp_path)


@pytest.mark.parametrize("regions", [None, "r", [1], [{"kind": "file"}]])
def test_open_refuses_a_malformed_region_list(tmp_path: Path, regions: Any) -> None:
    with pytest.raises(ShareError, match="malformed regions"):
        open_share({"version": 2, "regions": regions, "tree": tensor_node()}, "cpu", tmp_path)


def test_dtype_from_name_lists_the_supported_dtypes() -> None:
    with pytest.raises(ShareError, match=r"unsupported dtype 'float8'; supported: \['bfloat16'"):
        shared_tensors.dtype_from_name("float8")
