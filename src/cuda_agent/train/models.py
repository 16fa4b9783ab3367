"""The trained models: the actor (a causal LM), the critic (a value model of its own, or a value
head on the actor's trunk), and the frozen reference for the KL penalty; loading, precision,
LoRA, and saving in the formats the next stage and the ``hf`` policy read.

Output folders::

    actor/              transformers model folder + tokenizer (LoRA adapters merged in)
    critic/critic.json  {"kind": "separate" | "shared", "hidden_size": H}
    critic/value_head.safetensors
    critic/ (separate)  the backbone's transformers files beside the head
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from cuda_agent.attention_backends import without_cudnn_attention
from cuda_agent.train.config import ModelConfig

logger = logging.getLogger(__name__)

CRITIC_FILE = "critic.json"
HEAD_FILE = "value_head.safetensors"


class ModelLoadError(ValueError):
    """A model folder is missing or not what a stage expects; the message names the folder."""


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"model.device is {device!r} but no CUDA GPU is visible")
    return torch.device(device)


@dataclass(frozen=True)
class Precision:
    """How weights are stored and how forward passes run."""

    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None
    """Forward passes run under ``torch.autocast`` with this dtype (mixed precision), or not."""

    @classmethod
    def from_name(cls, name: str, device: torch.device) -> Precision:
        if name == "auto":
            name = "bf16-mixed" if device.type == "cuda" else "fp32"
        return {"fp32": cls(torch.float32, None), "bf16-mixed": cls(torch.float32, torch.bfloat16),
                "bf16": cls(torch.bfloat16, None)}[name]

    @contextlib.contextmanager
    def autocast(self, device: torch.device) -> Iterator[None]:
        """Where forward passes run: under autocast when this precision has one, attention kept
        off cuDNN (:mod:`cuda_agent.attention_backends`: padded lengths change every batch)."""
        cast = torch.autocast(device.type, dtype=self.autocast_dtype) if self.autocast_dtype is not None \
            else contextlib.nullcontext()
        with without_cudnn_attention(device.type), cast:
            yield


class ValueHead(nn.Module):
    """``hidden [B, L, H] -> values [B, L]``: one linear layer in float32, zero-initialised so a
    fresh critic predicts 0 everywhere."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):  # float32 even inside a bf16 forward pass
            return self.linear(hidden.float()).squeeze(-1)


class Critic(nn.Module):
    """The value function: ``backbone`` (None: the actor's trunk supplies the hidden states) and its head."""

    def __init__(self, head: ValueHead, backbone: nn.Module | None) -> None:
        super().__init__()
        self.head, self.backbone = head, backbone

    @property
    def shared(self) -> bool:
        return self.backbone is None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Values ``[B, L]`` (separate critics only; a shared head is applied to the actor's hidden states)."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.head(hidden)


def _hidden_size(model: nn.Module) -> int:
    config = model.config
    return int(getattr(config, "hidden_size", None) or getattr(config, "n_embd"))


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.chat_template is None:
        raise ModelLoadError(f"{path}: the tokenizer has no chat template (the agent's text protocol needs one)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _check_folder(path: Path | None, what: str) -> Path:
    if path is None:
        raise ModelLoadError(f"no {what} given (model.path in the config, or the previous stage's output)")
    if not (Path(path) / "config.json").is_file():
        raise ModelLoadError(f"{path}: not a transformers model folder (no config.json) for the {what}")
    return Path(path)


class ModelSet:
    """The models one stage trains or uses, on one device, in one precision.

    Args:
        config: the ``model`` section.
        actor_path: the actor to start from.
        critic_from: ``None`` (no critic), a ``critic/`` folder written by :func:`save_critic`, or
            a transformers folder to build a fresh critic from (``config.critic`` decides its kind).
        reference: also keep a frozen copy of the starting actor (the KL penalty's reference).
        train_actor: False freezes the actor (value pre-training).
    """

    def __init__(self, config: ModelConfig, actor_path: Path, critic_from: Path | None = None,
                 reference: bool = False, train_actor: bool = True) -> None:
        from transformers import AutoModelForCausalLM

        self.config = config
        self.device = resolve_device(config.device)
        self.precision = Precision.from_name(config.precision, self.device)
        self.actor_path = _check_folder(actor_path, "actor")
        self.tokenizer = load_tokenizer(self.actor_path)
        actor = AutoModelForCausalLM.from_pretrained(self.actor_path, dtype=self.precision.param_dtype)
        if config.gradient_checkpointing:
            actor.gradient_checkpointing_enable()
        self.lora = config.lora.rank > 0
        if self.lora:
            actor = _with_lora(actor, config)
        self.actor = actor.to(self.device)  # with LoRA, peft already froze all but the adapters
        if not train_actor:
            self.actor.requires_grad_(False)
        self.reference = None
        if reference and not self.lora:
            self.reference = copy.deepcopy(self.actor).requires_grad_(False).eval()
        self.critic = self._load_critic(critic_from) if critic_from is not None else None

    def _load_critic(self, source: Path) -> Critic:
        from transformers import AutoModel

        marker = source / CRITIC_FILE
        kind = json.loads(marker.read_text())["kind"] if marker.is_file() else self.config.critic
        backbone = None
        if kind == "separate":
            backbone = AutoModel.from_pretrained(_check_folder(source, "critic"), dtype=self.precision.param_dtype)
            if self.config.gradient_checkpointing:
                backbone.gradient_checkpointing_enable()
        head = ValueHead(_hidden_size(backbone if backbone is not None else self.actor))
        if marker.is_file():
            from safetensors.torch import load_file

            head.load_state_dict(load_file(source / HEAD_FILE))
        return Critic(head, backbone).to(self.device)

    @contextlib.contextmanager
    def reference_policy(self) -> Iterator[nn.Module]:
        """The frozen starting actor: the LoRA base with adapters disabled, or the kept copy."""
        if self.lora:
            with self.actor.disable_adapter():
                yield self.actor
        elif self.reference is not None:
            yield self.reference
        else:
            raise RuntimeError("no reference model was loaded (kl_coef is 0)")

    def autocast(self) -> contextlib.AbstractContextManager:
        return self.precision.autocast(self.device)

    def trainable(self) -> dict[str, nn.Module]:
        """The modules whose parameters a checkpoint must hold (by name)."""
        modules: dict[str, nn.Module] = {}
        if any(p.requires_grad for p in self.actor.parameters()):
            modules["actor"] = self.actor
        if self.critic is not None:
            modules["critic"] = self.critic
        return modules

    def train_mode(self, training: bool) -> None:
        for module in (self.actor, self.critic):
            if module is not None:
                module.train(training)

    def save_actor(self, folder: Path, adapter_folder: Path) -> None:
        """Write the actor (adapters merged) and tokenizer as a transformers folder and, with LoRA,
        the adapters alone to ``adapter_folder`` (a PEFT folder: the ``hf`` policy's
        ``adapter_path`` applies it to the starting model). Merging changes the live model, so call
        it when the stage is done with the actor."""
        if self.lora:
            self.actor.save_pretrained(adapter_folder)
        model = self.actor.merge_and_unload() if self.lora else self.actor
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    def save_critic(self, folder: Path) -> None:
        if self.critic is None:
            raise RuntimeError("this stage has no critic to save")
        save_critic(self.critic, folder)


def save_critic(critic: Critic, folder: Path) -> None:
    """Write ``critic`` so that :class:`ModelSet` (``critic_from=folder``) loads it back."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if critic.backbone is not None:
        critic.backbone.save_pretrained(folder)
    save_file({k: v.detach().cpu().contiguous() for k, v in critic.head.state_dict().items()}, folder / HEAD_FILE)
    (folder / CRITIC_FILE).write_text(json.dumps({"kind": "shared" if critic.shared else "separate",
                                                  "hidden_size": critic.head.linear.in_features}) + "\n")


def _with_lora(model: nn.Module, config: ModelConfig) -> nn.Module:
    try:
        from peft import LoraConfig as PeftLoraConfig, get_peft_model
    except ImportError:
        raise ModelLoadError("model.lora.rank > 0 needs peft: pip install 'cuda-agent[train]'") from None
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [m for m in config.lora.target_modules if m in present]
    if not targets:
        raise ModelLoadError(f"model.lora.target_modules {list(config.lora.target_modules)} match no module of "
                             f"the actor; its linear layers include {sorted(present)[:20]}")
    lora = PeftLoraConfig(r=config.lora.rank, lora_alpha=config.lora.alpha, lora_dropout=config.lora.dropout,
                          target_modules=targets, layers_to_transform=_last_layers(model, config.lora.last_layers),
                          task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def _last_layers(model: nn.Module, count: int) -> list[int] | None:
    """Indices of the model's last ``count`` transformer blocks (None: all of them)."""
    if count == 0:
        return None
    blocks = getattr(model.config, "num_hidden_layers", None)
    if not isinstance(blocks, int):
        raise ModelLoadError("model.lora.last_layers needs the actor's config to state num_hidden_layers; "
                             "set last_layers: 0 to adapt every block")
    return list(range(max(0, blocks - count), blocks))


def parameter_count(module: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)
