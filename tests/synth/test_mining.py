"""Seed mining: introspection finds the operators, probing describes them, crashes cost one op."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from cuda_agent.synth.mining import (
    Candidate, SeedCatalogue, discover_candidates, load_catalogue, mine_seed_ops, probe_candidates, save_catalogue,
)
from cuda_agent.synth.records import FAMILIES, SEED_OPS_VERSION

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> SeedCatalogue:
    """The full catalogue, mined once per session (test_composer.py reads the same file)."""
    path = tmp_path_factory.getbasetemp() / "seed-catalogue.json"
    if not path.exists():
        save_catalogue(mine_seed_ops(), path)
    return load_catalogue(path)


@pytest.fixture(scope="module")
def ops(catalogue: SeedCatalogue) -> dict:
    return {op.name: op for op in catalogue.ops}


def test_mining_finds_at_least_150_distinct_torch_operators(catalogue: SeedCatalogue) -> None:
    torch_ops = {op.name for op in catalogue.ops if op.source == "torch"}
    assert len(torch_ops) >= 150
    assert len(torch_ops) == len([op for op in catalogue.ops if op.source == "torch"])
    families = {op.family for op in catalogue.ops}
    assert families <= set(FAMILIES)
    assert {"activation", "normalization", "convolution", "pooling", "linear", "elementwise", "reduction",
            "linalg", "shape", "loss", "attention"} <= families
    assert catalogue.version == SEED_OPS_VERSION and catalogue.torch_version


def test_modules_are_constructed_with_sizes_from_parameter_names(ops: dict) -> None:
    linear, conv = ops["torch.nn.Linear"], ops["torch.nn.Conv2d"]
    assert linear.kind == "module" and linear.family == "linear" and linear.shape_rule == "same"
    assert linear.init == {"in_features": "{last}", "out_features": "{last}"} and linear.params > 0
    assert set(linear.ranks) == {1, 2, 3, 4}
    assert conv.family == "convolution" and conv.ranks == (4,)
    assert conv.init["in_channels"] == conv.init["out_channels"] == "{dim1}" and conv.init["kernel_size"] == 3
    assert ops["torch.nn.BatchNorm2d"].init == {"num_features": "{dim1}"}
    assert ops["torch.nn.LayerNorm"].init == {"normalized_shape": ["{last}"]}
    assert ops["torch.nn.MultiheadAttention"].arity == 3 and ops["torch.nn.MultiheadAttention"].output_index == 0


def test_functions_are_probed_for_arity_axis_and_layout(ops: dict) -> None:
    assert ops["torch.add"].arity == 2 and ops["torch.abs"].arity == 1
    assert ops["torch.nn.functional.softmax"].init == {"dim": -1}
    assert ops["torch.nn.functional.softmax"].family == "activation"
    assert ops["torch.matmul"].operand == "transposed" and ops["torch.matmul"].family == "linear"
    assert ops["torch.linalg.inv"].square and ops["torch.linalg.inv"].family == "linalg"
    assert ops["torch.topk"].output_index == 0 and ops["torch.topk"].shape_rule == "reduce"
    assert ops["torch.sum"].shape_rule == "scalar"
    assert ops["torch.transpose"].shape_rule == "reshape"
    assert {"float32", "float16", "bfloat16"} <= set(ops["torch.nn.functional.gelu"].dtypes)


def test_stochastic_and_inplace_ops_are_flagged(ops: dict) -> None:
    assert ops["torch.nn.Dropout"].stochastic and ops["torch.nn.functional.dropout"].stochastic
    assert ops["torch.relu_"].inplace and not ops["torch.relu"].inplace
    assert not ops["torch.nn.Linear"].stochastic


def test_useless_and_infrastructure_candidates_are_left_out(catalogue: SeedCatalogue) -> None:
    names = {op.name for op in catalogue.ops}
    assert catalogue.rejected["torch.clone"].startswith("identity")
    assert catalogue.rejected["torch.zeros_like"].startswith("input-independent")
    assert not {"torch.clone", "torch.zeros_like", "torch.argmax", "torch.nn.Identity"} & names
    assert "torch.manual_seed" not in names and "torch.manual_seed" not in catalogue.rejected


def test_catalogue_round_trips_through_json(catalogue: SeedCatalogue, tmp_path: Path) -> None:
    path = tmp_path / "seeds.json"
    save_catalogue(catalogue, path)
    assert load_catalogue(path) == catalogue


@pytest.mark.parametrize("corrupt, message", [
    (lambda data: "{not json", "not a JSON seed catalogue"),
    (lambda data: {k: v for k, v in data.items() if k != "ops"}, "missing field 'ops'"),
    (lambda data: {**data, "version": "0"}, "field 'version' is '0'"),
    (lambda data: {**data, "notes": "none"}, "field 'notes' has type str"),
    (lambda data: {**data, "ops": [{**data["ops"][0], "family": "magic"}]}, r"ops\[0\].*field 'family' is 'magic'"),
    (lambda data: {**data, "ops": [{k: v for k, v in data["ops"][0].items() if k != "arity"}]},
     r"ops\[0\].*missing field\(s\) arity"),
])
def test_load_catalogue_names_file_and_field_on_bad_input(catalogue: SeedCatalogue, tmp_path: Path,
                                                           corrupt, message: str) -> None:
    good = tmp_path / "good.json"
    save_catalogue(SeedCatalogue(ops=catalogue.ops[:1], torch_version="x"), good)
    bad = tmp_path / "bad.json"
    changed = corrupt(json.loads(good.read_text()))
    bad.write_text(changed if isinstance(changed, str) else json.dumps(changed))
    with pytest.raises(ValueError, match=message) as caught:
        load_catalogue(bad)
    assert str(bad) in str(caught.value)


def test_without_transformers_mining_covers_torch_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    candidates, notes = discover_candidates(include_transformers=True)
    assert candidates and all(c.source == "torch" for c in candidates)
    assert any("transformers is not installed" in note for note in notes)
    assert any("not mined" in note for note in discover_candidates(include_transformers=False)[1])


@pytest.mark.skipif(HAS_TRANSFORMERS, reason="transformers is installed")
def test_catalogue_without_transformers_records_it(catalogue: SeedCatalogue) -> None:
    assert catalogue.transformers_version is None
    assert any("transformers is not installed" in note for note in catalogue.notes)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")
def test_transformers_blocks_construct_from_small_configs(ops: dict, catalogue: SeedCatalogue) -> None:
    assert catalogue.transformers_version
    mlp = ops["transformers.models.llama.modeling_llama.LlamaMLP"]
    assert mlp.source == "transformers" and mlp.family == "mlp" and mlp.config.endswith("LlamaConfig")
    assert mlp.init["config"]["hidden_size"] == "{last}"
    assert ops["transformers.models.llama.modeling_llama.LlamaRMSNorm"].family == "normalization"
    attention = ops["transformers.models.gpt2.modeling_gpt2.GPT2Attention"]
    assert attention.family == "attention" and attention.output_index == 0
    assert any(op.name.startswith("transformers.activations.") for op in catalogue.ops)


CRASHY = '''
import ctypes


def segfault(x):
    return ctypes.string_at(0)


def hang(x):
    while True:
        pass


def double(x):
    return x * 2
'''


def test_probe_that_crashes_or_hangs_drops_only_that_candidate(tmp_path: Path) -> None:
    (tmp_path / "crashy.py").write_text(CRASHY)
    candidates = [Candidate(f"crashy.{name}", "function", "torch") for name in ("segfault", "double", "hang")]
    candidates.append(Candidate("torch.nn.functional.relu", "function", "torch"))
    ops, rejected = probe_candidates(candidates, workers=1, timeout_s=5, import_paths=(str(tmp_path),))
    assert [op.name for op in ops] == ["crashy.double", "torch.nn.functional.relu"]
    assert set(rejected) == {"crashy.segfault", "crashy.hang"}
    assert "SIGSEGV" in rejected["crashy.segfault"] and "within 5 s" in rejected["crashy.hang"]
    assert all(reason.startswith("crashed the probe worker") for reason in rejected.values())
