"""A local Hugging Face ``transformers`` model as a policy: offline runs and the trainer's rollouts.

The model speaks the text tool protocol (:mod:`cuda_agent.agent.text_protocol`) through its own
chat template, so any chat model works. Concurrent episodes are batched: requests arriving within
``batch_wait_s`` of each other are generated together (left padding), up to ``max_batch``.
Every reply carries the exact prompt and completion token ids (what a trainer needs; the
trajectory stores them per step). ``transformers`` (and ``peft`` for adapters) are imported only
here: ``pip install 'cuda-agent[hf]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.agent.base import Policy, PolicyError, PolicyReply
from cuda_agent.agent.text_protocol import render_for_text_model, reply_from_text
from cuda_agent.attention_backends import without_cudnn_attention


@dataclass(frozen=True)
class HFConfig:
    """Which local model to load and how to sample from it."""

    model_path: Path
    """A folder ``save_pretrained`` wrote (model and tokenizer with a chat template)."""
    adapter_path: Path | None = None
    """A PEFT adapter folder to apply on top (needs ``peft``)."""
    device: str = "cpu"
    """``cpu``, ``cuda`` or ``cuda:<n>``."""
    dtype: str = "float32"
    """``float32``, ``bfloat16`` or ``float16``."""
    max_new_tokens: int = 2048
    temperature: float = 0.7
    """0 decodes greedily."""
    top_p: float = 1.0
    max_batch: int = 8
    """Most episodes generated together in one batch."""
    batch_wait_s: float = 0.02
    """How long the first request of a batch waits for others to join."""
    seed: int | None = None
    """Seed torch's generator once when the model loads (reproducible sampling)."""
    autocast: str | None = None
    """Generate under ``torch.autocast`` with this dtype (``bfloat16`` or ``float16``): for a model
    kept in float32 (a trainer's mixed-precision actor) on a GPU; None: the model's own dtype."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_path", Path(self.model_path))
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"hf.dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.autocast not in (None, "bfloat16", "float16"):
            raise ValueError(f"hf.autocast must be bfloat16, float16 or null, got {self.autocast!r}")
        if self.max_new_tokens < 1 or self.max_batch < 1:
            raise ValueError("hf.max_new_tokens and hf.max_batch must be >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.batch_wait_s < 0:
            raise ValueError("hf.temperature must be >= 0, hf.top_p in (0, 1], hf.batch_wait_s >= 0")


@dataclass(frozen=True)
class Generation:
    """One generated turn: token ids of its prompt and completion, and the decoded text."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    text: str
    finish_reason: str
    """``stop`` (end-of-sequence generated) or ``length`` (cut at ``max_new_tokens``)."""


class HFPolicy(Policy):
    """Args:
        config: which model and how to sample.
        model, tokenizer: an already loaded model and its tokenizer to generate with instead of
            loading ``config.model_path`` (a trainer's actor, updated in place between rollouts;
            ``model_path`` then only names it in trajectories).
    """

    name = "hf"

    def __init__(self, config: HFConfig, model: Any = None, tokenizer: Any = None) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError:
            raise PolicyError("the hf policy needs transformers: pip install 'cuda-agent[hf]'") from None
        self.config, self._torch = config, torch
        if model is None and not (config.model_path / "config.json").is_file():
            raise PolicyError(f"{config.model_path}: not a transformers model folder (no config.json)")
        if config.seed is not None:
            torch.manual_seed(config.seed)
        self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(config.model_path)
        if self.tokenizer.chat_template is None:
            raise PolicyError(f"{config.model_path}: the tokenizer has no chat template")
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=getattr(torch, config.dtype))
            if config.adapter_path is not None:
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, config.adapter_path)
            model = model.to(config.device)
        self.model = model.eval()
        self.stop_ids = stop_token_ids(self.tokenizer, model)
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self._pending: list[tuple[tuple[int, ...], asyncio.Future]] = []
        self._batcher: asyncio.Task | None = None

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {"name": self.name, "model": str(c.model_path), "adapter": str(c.adapter_path or ""),
                "temperature": c.temperature, "top_p": c.top_p, "max_new_tokens": c.max_new_tokens,
                "tool_protocol": "text"}

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> tuple[int, ...]:
        """The token ids of ``messages`` under the chat template, ending in the generation prompt."""
        encoded = self.tokenizer.apply_chat_template(render_for_text_model(messages, tools),
                                                     add_generation_prompt=True, tokenize=True)
        return tuple(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    def count_tokens(self, messages: list[dict[str, Any]]) -> int:
        text = "".join(str(m.get("content") or "") for m in messages)
        return len(self.tokenizer.encode(text, add_special_tokens=False)) + 8 * len(messages)

    def generate_batch(self, prompts: list[tuple[int, ...]]) -> list[Generation]:
        """Generate one completion per prompt (token ids) in one padded batch, decoding with a KV
        cache (a trainer's actor may have turned the cache off for its training passes) and attention
        off cuDNN (:mod:`cuda_agent.attention_backends`: every decoding step has a new length)."""
        torch, tok, cfg = self._torch, self.tokenizer, self.config
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + list(p) for p in prompts])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        sampling = {"do_sample": True, "temperature": cfg.temperature, "top_p": cfg.top_p} \
            if cfg.temperature > 0 else {"do_sample": False}
        device_type = torch.device(cfg.device).type
        autocast = torch.autocast(device_type, dtype=getattr(torch, cfg.autocast)) \
            if cfg.autocast else contextlib.nullcontext()
        with torch.no_grad(), autocast, without_cudnn_attention(device_type):
            output = self.model.generate(input_ids=input_ids.to(cfg.device), attention_mask=attention.to(cfg.device),
                                         max_new_tokens=cfg.max_new_tokens, pad_token_id=tok.pad_token_id,
                                         eos_token_id=list(self.stop_ids), use_cache=True, **sampling)
        generations = []
        for prompt, row in zip(prompts, output[:, width:].tolist()):
            stop = next((i + 1 for i, token in enumerate(row) if token in self.stop_ids), None)
            completion = tuple(row[:stop])
            generations.append(Generation(prompt, completion, tok.decode(completion, skip_special_tokens=True),
                                          "length" if stop is None else "stop"))
        return generations

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], episode_id: str) -> PolicyReply:
        prompt = self.prompt_ids(messages, tools)
        if self.max_positions and len(prompt) + self.config.max_new_tokens > self.max_positions:
            raise PolicyError(f"{self.config.model_path}: a prompt of {len(prompt)} tokens plus max_new_tokens="
                              f"{self.config.max_new_tokens} exceeds the model's {self.max_positions} positions; "
                              f"set agent.context.window_tokens to at most {self.max_positions}")
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((prompt, future))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run_batches())
        generation: Generation = await future
        return reply_from_text(generation.text, generation.prompt_ids, generation.completion_ids,
                               generation.finish_reason)

    async def _run_batches(self) -> None:
        while self._pending:
            await asyncio.sleep(self.config.batch_wait_s)
            batch, self._pending = self._pending[: self.config.max_batch], self._pending[self.config.max_batch:]
            try:
                results = await asyncio.to_thread(self.generate_batch, [prompt for prompt, _ in batch])
            except Exception as exc:  # a model failure fails its episodes, not the runner
                for _, future in batch:
                    future.set_exception(PolicyError(f"generation failed: {type(exc).__name__}: {exc}"))
                continue
            for (_, future), result in zip(batch, results):
                future.set_result(result)


def stop_token_ids(tokenizer: Any, model: Any) -> tuple[int, ...]:
    """Every token that ends a turn: the tokenizer's end-of-sequence token and the model's
    generation config's (one id or several: chat models often end a turn with a token of their
    own, e.g. ``<|eot_id|>`` or ``<|im_end|>``, beside the end-of-text token)."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    configured = configured if isinstance(configured, (list, tuple)) else [configured]
    return tuple(dict.fromkeys(i for i in (tokenizer.eos_token_id, *configured) if i is not None))
