"""RFT of a real pretrained chat model with the shipped configs/train/smollm2-cpu.yaml: SmolLM2-135M-
Instruct fine-tunes LoRA adapters on the bundled recorded episode, rendered in its own chat template
with the tool output masked; the loss falls, and the adapter saves, reloads onto the base model and
generates what the merged actor generates."""

from __future__ import annotations

import json

import torch
import yaml
from transformers import AutoTokenizer
from typer.testing import CliRunner

from cuda_agent.agent.masks import token_masks
from cuda_agent.agent.model_import import import_model
from cuda_agent.agent.policies.hf_policy import HFConfig, HFPolicy
from cuda_agent.agent.trajectory import read_trajectories
from cuda_agent.cli import app

from support import REPO_ROOT

CONFIG = REPO_ROOT / "configs" / "train" / "smollm2-cpu.yaml"


def test_smollm2_rft_loss_falls_and_the_adapter_reloads_and_generates(tmp_path, monkeypatch):
    model = import_model("smollm2")
    monkeypatch.chdir(REPO_ROOT)  # the config's paths are relative to the repository root
    out = tmp_path / "rft"
    result = CliRunner().invoke(app, ["train", "rft", "--config", str(CONFIG), "--model", str(model),
                                      "--out", str(out), "--json"], env={"COLUMNS": "300", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    (stage,) = json.loads(result.output.strip().splitlines()[-1])
    assert stage["completed"] and stage["summary"]["filter"]["kept"] == 1

    losses = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and losses[-1]["sft/loss"] < losses[0]["sft/loss"], [m["sft/loss"] for m in losses]
    (recorded,) = read_trajectories(REPO_ROOT / yaml.safe_load(CONFIG.read_text())["rft"]["trajectories"][0])
    ids, mask = token_masks(recorded.messages, recorded.tools, AutoTokenizer.from_pretrained(model))
    assert losses[0]["sft/tokens"] == len(ids) and losses[0]["sft/policy_tokens"] == sum(mask[1:])

    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter["layers_to_transform"] == [28, 29] and adapter["r"] == 8
    adapted = HFPolicy(HFConfig(model_path=model, adapter_path=out / "adapter", max_new_tokens=12, temperature=0))
    merged = HFPolicy(HFConfig(model_path=out / "actor", max_new_tokens=12, temperature=0))
    prompt = adapted.prompt_ids([{"role": "user", "content": "Write a CUDA kernel for ReLU."}], [])
    ids_tensor = torch.tensor([prompt])
    with torch.no_grad():
        tuned = adapted.model(input_ids=ids_tensor).logits
        with adapted.model.disable_adapter():
            base = adapted.model(input_ids=ids_tensor).logits
        assert torch.allclose(merged.model(input_ids=ids_tensor).logits, tuned, atol=1e-3)
    assert not torch.allclose(tuned, base, atol=1e-3)  # the adapters moved the policy
    (from_adapter,), (from_merged,) = adapted.generate_batch([prompt]), merged.generate_batch([prompt])
    assert from_adapter.completion_ids == from_merged.completion_ids and from_adapter.text.strip()
