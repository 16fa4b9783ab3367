"""The PPO update on token rows: score a rollout (old log-probs, reference log-probs, values),
compute GAE per episode, then epochs of shuffled minibatches with gradient accumulation over
micro-batches. With no actor optimiser (value pre-training) only the critic learns.

    learner = PPOLearner(models, algorithm, actor_optim, critic_optim, updates=steps, temperature=1.0)
    scored = learner.score(rows)                     # no grad; while the rewards are evaluated
    batch = learner.estimate(scored, rewards)        # GAE per episode
    metrics = learner.update(batch)                  # optimizer steps
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from cuda_agent.train import algorithms
from cuda_agent.train.checkpoint import Stateful
from cuda_agent.train.config import OptimConfig, PPOAlgorithmConfig
from cuda_agent.train.models import ModelSet
from cuda_agent.train.sequences import PaddedRows, TokenRow, episode_gae, micro_batches, pad_rows
from cuda_agent.train.trainer import ModuleState, make_optimizer, make_scheduler, optimizer_step


@dataclass
class ScoredBatch:
    """A rollout ready for the update: per row, tensors ``[len(ids) - 1]`` on the CPU."""

    rows: list[TokenRow]
    old_log_probs: list[torch.Tensor | None]
    ref_log_probs: list[torch.Tensor | None]
    old_values: list[torch.Tensor | None]
    advantages: list[torch.Tensor]
    returns: list[torch.Tensor]

    @property
    def tokens(self) -> int:
        return sum(len(r.ids) for r in self.rows)

    def explained_variance(self) -> float:
        """How much of the returns' variance the critic's old values explained (1: all; <= 0: none)."""
        mask = torch.cat([torch.tensor(r.policy_mask[1:], dtype=torch.bool) for r in self.rows])
        returns, values = torch.cat(self.returns)[mask], torch.cat(self.old_values)[mask]
        if returns.numel() < 2:
            return float("nan")
        return float(1.0 - torch.var(returns - values) / torch.var(returns).clamp(min=1e-8))

    def outcome_value_gap(self, rewards: Sequence[float | None]) -> float | None:
        """The critic's old value at the last policy token of passing episodes (reward > 0) minus
        that of failing ones; None unless both occur. Above 0 when, by an episode's end, the critic
        tells how it went: what lets GAE pin a failure on the tokens that caused it (the
        explained variance cannot show it while the tokens before a slip are alike in both)."""
        last: dict[int, float] = {}
        for row, values in zip(self.rows, self.old_values):
            positions = torch.nonzero(torch.tensor(row.policy_mask[1:])).flatten()
            if values is not None and len(positions) and rewards[row.episode] is not None:
                last[row.episode] = float(values[positions[-1]])  # an episode's rows come in order
        passed = [v for e, v in last.items() if rewards[e] > 0]
        failed = [v for e, v in last.items() if rewards[e] <= 0]
        return sum(passed) / len(passed) - sum(failed) / len(failed) if passed and failed else None


class PPOLearner:
    """Args:
        models: actor and critic (the critic is required).
        algorithm: GAE and loss settings.
        actor_optim: None freezes the actor (value pre-training).
        critic_optim: the critic's optimiser settings.
        updates: rollout steps of the stage (the learning-rate schedules span ``updates * epochs * minibatches``).
        temperature: the sampling temperature (log-probabilities are taken under it).
    """

    def __init__(self, models: ModelSet, algorithm: PPOAlgorithmConfig, actor_optim: OptimConfig | None,
                 critic_optim: OptimConfig, updates: int, temperature: float) -> None:
        if models.critic is None:
            raise ValueError("PPO needs a critic")
        self.models, self.algorithm, self.temperature = models, algorithm, temperature
        self.actor_optim, self.critic_optim = actor_optim, critic_optim
        total = updates * algorithm.epochs * algorithm.minibatches
        self.update_actor = actor_optim is not None
        self.actor_optimizer = make_optimizer(models.actor.parameters(), actor_optim) if self.update_actor else None
        critic_params = models.critic.head.parameters() if models.critic.shared else models.critic.parameters()
        self.critic_optimizer = make_optimizer(critic_params, critic_optim)
        self.actor_scheduler = make_scheduler(self.actor_optimizer, actor_optim, total) if self.actor_optimizer else None
        self.critic_scheduler = make_scheduler(self.critic_optimizer, critic_optim, total)
        self.pad_id = models.tokenizer.pad_token_id

    def state(self) -> dict[str, Stateful]:
        """What a checkpoint must hold to resume this learner exactly."""
        state: dict[str, Stateful] = {"critic": ModuleState(self.models.critic),
                                      "critic_optimizer": self.critic_optimizer, "critic_scheduler": self.critic_scheduler}
        if self.actor_optimizer is not None:
            state.update(actor=ModuleState(self.models.actor), actor_optimizer=self.actor_optimizer,
                         actor_scheduler=self.actor_scheduler)
        return state

    def _actor_pass(self, model: torch.nn.Module, padded: PaddedRows, grad: bool,
                    hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.set_grad_enabled(grad), self.models.autocast():
            out = model(input_ids=padded.input_ids, attention_mask=padded.attention_mask, use_cache=False,
                        output_hidden_states=hidden)
            log_probs = algorithms.token_log_probs(out.logits[:, :-1], padded.targets, self.temperature)
        return log_probs, out.hidden_states[-1][:, :-1] if hidden else None

    def _values(self, padded: PaddedRows, hidden: torch.Tensor | None, grad: bool) -> torch.Tensor:
        critic = self.models.critic
        with torch.set_grad_enabled(grad), self.models.autocast():
            if critic.shared:
                return critic.head(hidden)
            return critic(padded.input_ids, padded.attention_mask)[:, :-1]

    def _forward(self, padded: PaddedRows, grad: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Log-probs (when the actor learns) and values of a micro-batch."""
        shared = self.models.critic.shared
        log_probs = hidden = None
        if self.update_actor or shared:
            log_probs, hidden = self._actor_pass(self.models.actor, padded, grad and self.update_actor, shared)
        return log_probs, self._values(padded, hidden, grad)

    @torch.no_grad()
    def score(self, rows: list[TokenRow]) -> ScoredBatch:
        """Old log-probs, reference log-probs and values of a rollout's rows (no rewards needed
        yet: run it while the rewards are being evaluated)."""
        self.models.train_mode(False)
        count = len(rows)
        old_log_probs: list[torch.Tensor | None] = [None] * count
        ref_log_probs: list[torch.Tensor | None] = [None] * count
        values: list[torch.Tensor | None] = [None] * count
        lengths = [len(r.ids) for r in rows]
        for group in micro_batches(lengths, range(count), self.algorithm.micro_batch_tokens):
            padded = pad_rows([rows[i] for i in group], self.pad_id, self.models.device)
            log_probs, group_values = self._forward(padded, grad=False)
            reference = None
            if self.update_actor and self.algorithm.kl_coef > 0:
                with self.models.reference_policy() as model:
                    reference, _ = self._actor_pass(model, padded, grad=False, hidden=False)
            for j, i in enumerate(group):
                width = lengths[i] - 1
                values[i] = group_values[j, :width].float().cpu()
                old_log_probs[i] = log_probs[j, :width].cpu() if log_probs is not None else None
                ref_log_probs[i] = reference[j, :width].cpu() if reference is not None else None
        return ScoredBatch(rows, old_log_probs, ref_log_probs, values, [], [])

    def estimate(self, batch: ScoredBatch, rewards: Sequence[float | None]) -> ScoredBatch:
        """GAE advantages and returns from each episode's final reward; rows of episodes whose
        reward is ``None`` (no verdict reached) are left out.

        Args:
            rewards: indexed by ``TokenRow.episode``.
        """
        keep = [i for i, row in enumerate(batch.rows) if rewards[row.episode] is not None]
        kept = ScoredBatch(*([column[i] for i in keep] for column in (
            batch.rows, batch.old_log_probs, batch.ref_log_probs, batch.old_values)), [], [])
        if not kept.rows:
            return kept
        advantages, returns = episode_gae(kept.rows, kept.old_values, rewards, self.algorithm.gamma, self.algorithm.lam)
        if self.algorithm.normalize_advantages and self.update_actor:
            advantages = _whiten_rows(advantages, kept.rows)
        kept.advantages, kept.returns = advantages, returns
        return kept

    def update(self, batch: ScoredBatch) -> dict[str, float]:
        """``epochs`` passes of ``minibatches`` optimizer steps over the batch; mean diagnostics."""
        self.models.train_mode(True)
        totals: dict[str, float] = {}
        updates = 0
        for _ in range(self.algorithm.epochs):
            order = torch.randperm(len(batch.rows)).tolist()
            for minibatch in _split(order, self.algorithm.minibatches):
                for key, value in self._minibatch(batch, minibatch).items():
                    totals[key] = max(totals.get(key, value), value) if key.endswith("_max") else \
                        totals.get(key, 0.0) + value
                updates += 1
        self.models.train_mode(False)
        return {k: v if k.endswith("_max") else v / updates for k, v in totals.items()}

    def _minibatch(self, batch: ScoredBatch, indices: list[int]) -> dict[str, float]:
        rows = batch.rows
        token_count = float(sum(rows[i].policy_tokens for i in indices))
        lengths = [len(r.ids) for r in rows]
        stats: dict[str, float] = {}
        for group in micro_batches(lengths, indices, self.algorithm.micro_batch_tokens):
            padded = pad_rows([rows[i] for i in group], self.pad_id, self.models.device)
            log_probs, values = self._forward(padded, grad=True)
            loss, group_stats = self._loss(batch, group, padded, log_probs, values, token_count)
            loss.backward()
            for key, value in group_stats.items():
                stats[key] = max(stats.get(key, value), value) if key.endswith("_max") else stats.get(key, 0.0) + value
        if self.actor_optimizer is not None:
            stats["actor/grad_norm"] = optimizer_step(self.actor_optimizer, self.actor_scheduler,
                                                      self.actor_optim.max_grad_norm)
            stats["actor/lr"] = self.actor_scheduler.get_last_lr()[0]
        stats["critic/grad_norm"] = optimizer_step(self.critic_optimizer, self.critic_scheduler,
                                                   self.critic_optim.max_grad_norm)
        stats["critic/lr"] = self.critic_scheduler.get_last_lr()[0]
        return stats

    def _loss(self, batch: ScoredBatch, group: list[int], padded: PaddedRows, log_probs: torch.Tensor | None,
              values: torch.Tensor, token_count: float) -> tuple[torch.Tensor, dict[str, float]]:
        algo, mask = self.algorithm, padded.action_mask
        device, width = mask.device, mask.shape[1]
        stack = (lambda column: torch.stack([_pad(column[i], width) for i in group]).to(device))
        critic_loss, critic_stats = algorithms.value_loss(values.float(), stack(batch.old_values), stack(batch.returns),
                                                          mask, algo.value_clip, token_count)
        stats = {"critic/loss": float(critic_loss.detach()), "critic/clip_fraction": float(critic_stats["clip_fraction"])}
        loss = critic_loss * (algo.value_coef if self.models.critic.shared else 1.0)
        if log_probs is not None and self.update_actor:
            actor_loss, actor_stats = algorithms.policy_loss(log_probs, stack(batch.old_log_probs),
                                                             stack(batch.advantages), mask, algo.clip_low,
                                                             algo.clip_high, token_count)
            loss = loss + actor_loss
            stats.update({"actor/loss": float(actor_loss.detach()), "actor/clip_fraction": float(actor_stats["clip_fraction"]),
                          "actor/approx_kl": float(actor_stats["approx_kl"]),
                          "actor/ratio_max": float(actor_stats["ratio_max"])})
            if algo.kl_coef > 0:
                kl = algorithms.masked_mean(algorithms.kl_penalty(log_probs, stack(batch.ref_log_probs),
                                                                  algo.kl_estimator), mask, token_count)
                loss = loss + algo.kl_coef * kl
                stats["actor/kl_to_reference"] = float(kl.detach())
        return loss, stats


def _pad(values: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(values.float(), (0, width - values.shape[0]))


def _split(order: list[int], parts: int) -> list[list[int]]:
    """``order`` in ``parts`` contiguous, nearly equal, non-empty pieces."""
    parts = min(parts, len(order))
    size, extra = divmod(len(order), parts)
    pieces, start = [], 0
    for part in range(parts):
        end = start + size + (1 if part < extra else 0)
        pieces.append(order[start:end])
        start = end
    return pieces


def _whiten_rows(advantages: list[torch.Tensor], rows: list[TokenRow]) -> list[torch.Tensor]:
    width = max(len(a) for a in advantages)
    mask = torch.stack([_pad(torch.tensor(r.policy_mask[1:], dtype=torch.float32), width) for r in rows])
    whitened = algorithms.whiten(torch.stack([_pad(a, width) for a in advantages]), mask)
    return [whitened[i, : len(a)] for i, a in enumerate(advantages)]
