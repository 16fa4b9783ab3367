"""A randomly initialised chat model built from a config (no download): the starting point of
smoke runs, tests and throughput measurements.

The tokenizer is a byte-level BPE trained here on text the model will see (the agent's system
prompt and SKILL.md, its tool protocol, the warm-up prompt, task sources), with ChatML-style turn
markers and a prefix-stable chat template, so prompts tokenise compactly and loss masks derive
exactly. The model is a Llama of the chosen size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from cuda_agent.registry import Registry

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class ModelSize:
    """Shape of a random Llama."""

    hidden_size: int
    layers: int
    heads: int
    intermediate_size: int
    vocab_size: int
    """The BPE's target size (smaller when the corpus runs out of merges)."""


SIZES: Registry[ModelSize] = Registry("model size")
SIZES.register("tiny", ModelSize(64, 2, 4, 128, 512))
SIZES.register("small", ModelSize(256, 4, 4, 688, 4096))
SIZES.register("100m", ModelSize(768, 12, 12, 2048, 16384))


def default_corpus(extra: Iterable[str] = ()) -> list[str]:
    """The agent's own prompts and tool protocol (what every episode starts with), plus ``extra``."""
    from cuda_agent.agent.prompts import system_prompt
    from cuda_agent.agent.text_protocol import tool_instructions
    from cuda_agent.agent.tools import episode_tool_schemas
    from cuda_agent.train.environments.cuda import _WARMUP_PROMPT

    tools = episode_tool_schemas()
    calls = ['<tool_call>\n{"name": "bash", "arguments": {"command": "./build"}}\n</tool_call>',
             '<tool_call>\n{"name": "write_file", "arguments": {"path": "model_new.py", "content": ""}}\n</tool_call>']
    return [system_prompt(), tool_instructions(tools), _WARMUP_PROMPT, *calls, *extra]


def build_tokenizer(corpus: list[str], vocab_size: int, whole_tokens: tuple[str, ...] = ()):
    """A byte-level BPE tokenizer with the chat template, trained on ``corpus``.

    Args:
        whole_tokens: strings kept as one (ordinary, decoded) token each, e.g. a tool call's fixed
            prefix, so that a tiny model learns the call syntax in a few steps.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    if whole_tokens:
        tokenizer.add_tokens(list(whole_tokens))
    return tokenizer


def init_random_model(out: Path, size: str, corpus: list[str], seed: int = 0, max_positions: int = 32768,
                      whole_tokens: tuple[str, ...] = ()) -> int:
    """Write a random Llama of ``size`` and its tokenizer to ``out``; returns the parameter count.

    Raises:
        KeyError: unknown size (listing the valid ones).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = SIZES.get(size)
    tokenizer = build_tokenizer(corpus, shape.vocab_size, whole_tokens)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=shape.hidden_size,
                         intermediate_size=shape.intermediate_size, num_hidden_layers=shape.layers,
                         num_attention_heads=shape.heads, num_key_value_heads=shape.heads,
                         max_position_embeddings=max_positions, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())
