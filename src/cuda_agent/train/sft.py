"""Supervised fine-tuning on token rows, loss on the policy's (assistant) tokens only: the update
of rejection fine-tuning.

Built on the same models, rows, micro-batching, optimiser and checkpoint code as PPO rather than
on TRL's ``SFTTrainer``: the rows already carry the exact assistant-token masks the agent loop
produced (TRL would re-derive them from a chat template with generation tags), one optimiser and
checkpoint path serves every stage (so RFT resumes exactly like PPO), and the GPU image has no TRL.
"""

from __future__ import annotations

import time

from cuda_agent.train import algorithms
from cuda_agent.train.checkpoint import Stateful
from cuda_agent.train.config import OptimConfig
from cuda_agent.train.models import ModelSet
from cuda_agent.train.sequences import TokenRow, micro_batches, pad_rows
from cuda_agent.train.trainer import ModuleState, PeakMemory, make_optimizer, make_scheduler, optimizer_step


class SFTLearner:
    """Next-token cross-entropy on policy tokens, averaged over all policy tokens of a batch.

    Args:
        total_steps: optimizer steps of the whole stage (the schedule's length).
    """

    def __init__(self, models: ModelSet, optim: OptimConfig, total_steps: int, micro_batch_tokens: int) -> None:
        self.models, self.optim, self.micro_batch_tokens = models, optim, micro_batch_tokens
        self.optimizer = make_optimizer(models.actor.parameters(), optim)
        if self.optimizer is None:
            raise ValueError("the actor has no trainable parameters")
        self.scheduler = make_scheduler(self.optimizer, optim, total_steps)
        self.pad_id = models.tokenizer.pad_token_id

    def state(self) -> dict[str, Stateful]:
        return {"actor": ModuleState(self.models.actor), "actor_optimizer": self.optimizer,
                "actor_scheduler": self.scheduler}

    def step(self, rows: list[TokenRow]) -> dict[str, float]:
        """One optimizer step on ``rows``; returns the loss and token counts."""
        self.models.train_mode(True)
        memory = PeakMemory(self.models.device)
        started = time.monotonic()
        token_count = float(sum(r.policy_tokens for r in rows))
        lengths = [len(r.ids) for r in rows]
        loss_sum = 0.0
        for group in micro_batches(lengths, range(len(rows)), self.micro_batch_tokens):
            padded = pad_rows([rows[i] for i in group], self.pad_id, self.models.device)
            with self.models.autocast():
                logits = self.models.actor(input_ids=padded.input_ids, attention_mask=padded.attention_mask,
                                           use_cache=False).logits[:, :-1]
                loss = algorithms.masked_mean(-algorithms.token_log_probs(logits, padded.targets),
                                              padded.action_mask, token_count)
            loss.backward()
            loss_sum += float(loss.detach())
        grad_norm = optimizer_step(self.optimizer, self.scheduler, self.optim.max_grad_norm)
        self.models.train_mode(False)
        seconds = time.monotonic() - started
        return {"sft/loss": loss_sum, "sft/grad_norm": grad_norm, "sft/lr": self.scheduler.get_last_lr()[0],
                "sft/policy_tokens": token_count, "sft/tokens": float(sum(lengths)), "sft/seconds": seconds,
                "sft/tokens_per_s": sum(lengths) / max(seconds, 1e-9), **memory.metrics()}
