"""``cuda-agent agent import-model``: the packaged SmolLM2 GGUF becomes a transformers folder that
holds exactly the file's dequantised weights, converted once and reused; bad sources exit 2 naming
the source and what was expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cuda_agent.agent.model_import import IMPORT_RECORD, ModelImportError, import_model, resolve_source
from cuda_agent.cli import app


def test_smollm2_folder_holds_the_gguf_weights_dequantised_and_is_reused(smollm2_model):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    source = resolve_source("smollm2")
    gguf = source.path
    tensors = {t.name: t for t in GGUFReader(gguf).tensors}
    with safe_open(smollm2_model / "model.safetensors", "pt") as weights:
        for gguf_name, name in (("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"),  # Q4_1
                                ("token_embd.weight", "model.embed_tokens.weight"),  # Q8_0
                                ("blk.29.ffn_norm.weight", "model.layers.29.post_attention_layernorm.weight")):
            tensor = tensors[gguf_name]
            expected = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy())
            assert torch.equal(weights.get_tensor(name), expected.reshape(weights.get_tensor(name).shape)), name
    record = json.loads((smollm2_model / IMPORT_RECORD).read_text())
    # the conversion is cached per package version, so another environment's install of the same version may have made it
    assert record["source"] == "smollm2" and record["cache_key"] == source.cache_key
    assert Path(record["gguf"]).name == gguf.name
    config = json.loads((smollm2_model / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert "<|im_start|>" in (smollm2_model / "chat_template.jinja").read_text()
    stamp = (smollm2_model / "model.safetensors").stat().st_mtime_ns
    again = CliRunner().invoke(app, ["agent", "import-model", "smollm2"])
    assert again.exit_code == 0 and again.stdout.strip() == str(smollm2_model)
    assert (smollm2_model / "model.safetensors").stat().st_mtime_ns == stamp  # not converted again


def test_import_model_names_the_bad_source_and_what_was_expected(tmp_path):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip, not a GGUF file")
    for source, expected in (("smollm3", "neither a packaged model (smollm2) nor a GGUF file"),
                             (str(not_gguf), "not a GGUF file (it does not start with b'GGUF')")):
        result = CliRunner().invoke(app, ["agent", "import-model", source, "--out", str(tmp_path / "out")])
        assert result.exit_code == 2, result.output
        assert source in result.output and expected in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(ModelImportError, match="exists and is not a converted model"):
        import_model("smollm2", taken)
