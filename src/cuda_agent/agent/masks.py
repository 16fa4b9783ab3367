"""Token-level loss masks for training on trajectories (derived, never stored).

A trajectory's messages are rendered the way a local policy saw them (the text tool protocol,
:func:`~cuda_agent.agent.text_protocol.render_for_text_model`) and tokenized with the model's chat
template one message at a time. Tokens the policy generated (each assistant message's content and
the template's end-of-turn tokens after it) get mask 1; everything else (system prompt, task, tool
results, the template's assistant header) gets 0: PPO's policy and value losses then skip the
environment's tokens.

This needs a *prefix-stable* template (rendering ``messages[:k]`` yields a prefix of rendering
``messages[:k+1]``); templates that rewrite earlier turns (e.g. strip past reasoning) are refused
with :class:`MaskError`. Re-tokenizing text can differ from the ids a model generated; for exact
per-turn ids use the ``prompt_token_ids``/``completion_token_ids`` the ``hf`` policy stores in each step.
"""

from __future__ import annotations

from typing import Any

from cuda_agent.agent.text_protocol import render_for_text_model


class MaskError(ValueError):
    """The chat template does not render the conversation prefix-stably."""


def token_masks(messages: list[dict[str, Any]], tools: list[dict[str, Any]], tokenizer: Any) -> tuple[list[int], list[int]]:
    """Token ids of the whole conversation and a same-length 0/1 mask (1: policy tokens).

    Args:
        messages: a trajectory's ``messages`` (chat-completions form).
        tools: its ``tools`` (rendered into the system prompt as the text protocol does).
        tokenizer: a Hugging Face tokenizer with a chat template.

    Raises:
        MaskError: naming the message at which the template stopped being prefix-stable.
    """
    rendered = render_for_text_model(messages, tools)
    ids: list[int] = []
    mask: list[int] = []

    def extend(upto: int, generation_prompt: bool, value: int) -> None:
        full = _encode(tokenizer, rendered[:upto], generation_prompt)
        if full[: len(ids)] != ids:
            raise MaskError(f"the chat template is not prefix-stable at message {upto - 1} "
                            f"({rendered[upto - 1]['role']}); derive masks from stored token ids instead")
        mask.extend([value] * (len(full) - len(ids)))
        ids[:] = full

    for index, message in enumerate(rendered):
        if message["role"] == "assistant":
            extend(index, True, 0)  # the assistant header the template adds before generation
            extend(index + 1, False, 1)
        else:
            extend(index + 1, False, 0)
    return ids, mask


def _encode(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
    if not messages:
        return []
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
