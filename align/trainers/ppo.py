"""align's PPO trainer: a policy and its critic trained with clipped PPO against a KL-penalised reward.

TRL removed its PPO (shared/STACK.md), so align ships one. It is a `transformers.Trainer` subclass, as
TRL's trainers are, so every align backend runs it unchanged: DDP wraps, DeepSpeed ZeRO-2 partitions and
FSDP2 shards the one module the Trainer trains, `PolicyAndValue`, which holds the policy and its critic.

One rollout (per rank, `PPOConfig.rollout_batch_size` prompts):
1. the policy samples a completion per prompt with HF `generate`, cut at the stop token;
2. the rewards score the texts; a completion that never produced its stop token loses `missing_eos_penalty`;
3. no-grad forwards give the policy's and the reference's log-probs and the critic's values;
4. per-token rewards (KL penalty, score at the last token), GAE advantages (whitened) and returns.
Then `num_ppo_epochs` passes of `num_mini_batches` optimizer steps over the rollout: the Trainer's own
loop runs them, one micro-batch per `training_step`, drawn by `batch_from` from the rollout.

The reference is the policy with its adapters disabled under LoRA, else a frozen copy placed by the
backend; the critic is a value head on the policy's trunk, or its own LoRA adapter on the same frozen base
plus a head (`value: adapter`). Logged keys follow TRL's last PPO: objective/kl, objective/scores,
objective/rlhf_reward, objective/non_score_reward, loss/policy_avg, loss/value_avg, policy/clipfrac_avg,
policy/approxkl_avg, val/clipfrac_avg, val/num_eos_tokens; as GRPO logs them, `reward` (the mean score),
`reward_std` and `frac_reward_zero_std` (1 for a rollout whose scores have no spread: nothing to learn)
and `completions/clipped_ratio`.

A checkpoint holds what a resume needs to go on exactly as if never stopped: the Trainer's own files plus the
policy, the critic and PPO's state (KL coefficient, counters, the rollout in progress), as
align/trainers/ppo_checkpoint.py lays them out; `train(resume_from_checkpoint=...)` reads them back.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler
from transformers.trainer_utils import get_last_checkpoint

from align.compat.transformers import HookedTrainer
from align.trainers import ppo_checkpoint
from align.trainers.policy_value import PolicyAndValue, completion_log_probs
from align.trainers.ppo_config import PPOConfig
from align.trainers.ppo_math import (
    adaptive_kl_coef,
    generalized_advantages,
    masked_whiten,
    per_token_rewards,
    ppo_losses,
    token_log_probs,
)
from align.trainers.sampling import decode, generate, synced_clock, time_split

# rewards(prompts, completions, columns) -> (weighted score per completion, each reward's values)
RewardFn = Callable[[list[Any], list[Any], dict[str, list[Any]]], tuple[list[float], dict[str, list[float]]]]
# a reference run elsewhere (a Ray actor): (input_ids, attention_mask, prompt_length, temperature) -> the
# log-probs of the completion tokens, as `score_tokens` computes them from a local reference
ReferenceFn = Callable[[torch.Tensor, torch.Tensor, int, float], torch.Tensor]


class RolloutSampler(Sampler[list[int]]):
    """This rank's prompts for each rollout, each batch yielded once per micro-batch trained on it: the
    Trainer's loop then calls `training_step` exactly as often as PPO steps through the rollout.
    Every rank draws from the same seeded permutation and takes its own slice."""

    def __init__(self, size: int, batch: int, repeats: int, rank: int, world: int, seed: int) -> None:
        self.size, self.batch, self.repeats = size, batch, repeats
        self.rank, self.world, self.seed = rank, world, seed
        self.epoch = 0
        if size < batch * world:
            raise ValueError(
                f"a rollout takes {batch} prompts on each of {world} ranks, and the data has {size} rows"
            )

    def __len__(self) -> int:
        return self.size // (self.batch * self.world) * self.repeats

    def set_epoch(self, epoch: int) -> None:
        """The Trainer names each epoch, so a resumed run draws the order of the epoch it resumes in."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        self.epoch += 1
        step = self.batch * self.world
        for start in range(0, self.size - step + 1, step):
            indices = order[start + self.rank * self.batch : start + (self.rank + 1) * self.batch].tolist()
            for _ in range(self.repeats):
                yield indices


class RolloutLoader(DataLoader):
    """Passes the Trainer's `set_epoch` on to the `RolloutSampler` (a plain DataLoader has none)."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


@dataclass
class Rollout:
    """One rollout's tensors, row-aligned; `prompt_length` is where the completions start."""

    tensors: dict[str, torch.Tensor]
    prompt_length: int

    def select(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {key: value[rows] for key, value in self.tensors.items()}


class PPOTrainer(HookedTrainer):
    """PPO over a `PolicyAndValue`, with rewards given as one function (see `RewardFn`)."""

    def __init__(
        self,
        *,
        model: PolicyAndValue,
        ref_model: nn.Module | ReferenceFn | None,
        rewards: RewardFn,
        args: PPOConfig,
        train_dataset: Any,
        processing_class: Any,
        callbacks: list[Any] | None = None,
    ) -> None:
        for module in model.modules():  # PPO's ratio compares the same network twice: no dropout noise
            if isinstance(module, nn.Dropout):
                module.p = 0.0
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
        )
        self.ref_model = ref_model
        self.rewards = rewards
        self.kl_coef = args.kl_coef
        self.model_accepts_loss_kwargs = False  # the Trainer divides the loss by the accumulation steps
        self.rollout: Rollout | None = None
        self.schedule: list[torch.Tensor] = []
        self.micro_steps = 0
        self.shuffle = torch.Generator().manual_seed(args.seed)
        self.logged: dict[str, list[float]] = defaultdict(list)
        self.seconds = {"generate": 0.0, "score": 0.0}  # rollout phases; the update is the rest of train()

    # --- data: prompts in, one rollout per `micro_batches_per_rollout` micro-steps ---

    def get_train_dataloader(self) -> DataLoader:
        sampler = RolloutSampler(
            len(self.train_dataset),
            self.args.rollout_batch_size,
            self.args.micro_batches_per_rollout,
            self.args.process_index,
            self.args.world_size,
            self.args.seed,
        )
        return RolloutLoader(self.train_dataset, batch_sampler=sampler, collate_fn=list)

    def batch_from(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        position = self.micro_steps % self.args.micro_batches_per_rollout
        if position == 0:
            self.rollout = self.make_rollout(rows)
            self.schedule = self.micro_batch_order(len(rows))
        self.micro_steps += 1
        return self.rollout.select(self.schedule[position])

    def micro_batch_order(self, rows: int) -> list[torch.Tensor]:
        """Row indices of each micro-batch: every epoch a fresh shuffle, cut into mini- then micro-batches."""
        size, epochs = self.args.per_device_train_batch_size, range(self.args.num_ppo_epochs)
        return [batch for _ in epochs for batch in torch.randperm(rows, generator=self.shuffle).split(size)]

    # --- the rollout ---

    @torch.no_grad()
    def make_rollout(self, rows: list[dict[str, Any]]) -> Rollout:
        args, wrapper = self.args, self.model
        wrapper.eval()
        prompts = [row["prompt"] for row in rows]
        started = synced_clock()
        sampled = generate(
            wrapper.policy,
            self.processing_class,
            prompts,
            max_new_tokens=args.max_completion_length,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            stop_at_eos=args.stop_token == "eos",
            synced=args.world_size > 1,
        )
        generated = synced_clock()
        self.seconds["generate"] += generated - started
        columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
        scores, by_reward = self.rewards(prompts, decode(self.processing_class, sampled, prompts), columns)
        scores = torch.tensor(scores, dtype=torch.float32, device=sampled.completion_ids.device)
        if args.missing_eos_penalty is not None and args.stop_token == "eos":
            scores = scores - args.missing_eos_penalty * (~sampled.ended).float()
        input_ids, attention_mask = sampled.input_ids, sampled.attention_mask
        prompt_length = sampled.prompt_ids.shape[1]
        log_probs, values, ref_log_probs = self.score_tokens(
            wrapper, input_ids, attention_mask, prompt_length
        )
        self.seconds["score"] += synced_clock() - generated
        mask = sampled.completion_mask.float()
        kl = (log_probs - ref_log_probs) * mask
        rewards = per_token_rewards(scores, kl, mask, self.kl_coef)
        if args.whiten_rewards:
            rewards = masked_whiten(rewards, mask, shift_mean=False)
        advantages, returns = generalized_advantages(rewards, values, mask, args.gamma, args.lam)
        advantages = masked_whiten(advantages, mask)
        wrapper.train()
        self.record_rollout(scores, kl, mask, sampled.ended, by_reward)
        tensors = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "completion_mask": mask,
            "old_log_probs": log_probs,
            "old_values": values,
            "advantages": advantages,
            "returns": returns,
        }
        return Rollout(tensors, prompt_length)

    def score_tokens(
        self,
        wrapper: PolicyAndValue,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_length: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Policy log-probs, values and reference log-probs of the completion tokens, in chunks."""
        found = defaultdict(list)
        for rows in torch.arange(len(input_ids)).split(self.args.forward_batch_size):
            ids, mask = input_ids[rows], attention_mask[rows]
            tokens = ids[:, prompt_length:]
            logits, values = wrapper(ids, mask)
            span = slice(prompt_length - 1, -1)  # the logits at t predict the token at t + 1
            found["policy"].append(token_log_probs(logits[:, span], tokens, self.args.temperature))
            found["values"].append(values[:, span].float())
            found["reference"].append(self.reference_log_probs(wrapper, ids, mask, prompt_length))
        return tuple(torch.cat(found[key]) for key in ("policy", "values", "reference"))

    def reference_log_probs(
        self, wrapper: PolicyAndValue, ids: torch.Tensor, mask: torch.Tensor, prompt_length: int
    ) -> torch.Tensor:
        """The reference's log-probs of the completion tokens: the policy with its adapters disabled, a
        frozen copy, or a `ReferenceFn` that runs the same forward elsewhere."""
        if self.ref_model is not None and not isinstance(self.ref_model, nn.Module):
            return self.ref_model(ids, mask, prompt_length, self.args.temperature)
        with wrapper.reference() if self.ref_model is None else nullcontext():
            reference = wrapper.policy if self.ref_model is None else self.ref_model
            return completion_log_probs(reference, ids, mask, prompt_length, self.args.temperature)

    def record_rollout(
        self,
        scores: torch.Tensor,
        kl: torch.Tensor,
        mask: torch.Tensor,
        ended: torch.Tensor,
        by_reward: dict[str, list[float]],
    ) -> None:
        """Rollout statistics averaged over ranks; the adaptive KL controller steps on the global KL."""
        kl_per_sequence = kl.sum(dim=1)
        spread = self.accelerator.gather(scores).std(correction=0)  # over every rank's rollout
        local = {
            "objective/kl": kl_per_sequence.mean(),
            "objective/scores": scores.mean(),
            "objective/non_score_reward": (-self.kl_coef * kl_per_sequence).mean(),
            "objective/rlhf_reward": (scores - self.kl_coef * kl_per_sequence).mean(),
            "val/num_eos_tokens": ended.float().mean(),
            "completions/clipped_ratio": (~ended).float().mean(),
            "reward_std": spread,
            "frac_reward_zero_std": torch.isclose(spread, torch.zeros_like(spread)).float(),
            "completion_length": mask.sum(dim=1).mean(),
            **{
                f"rewards/{name}": torch.tensor(values, dtype=torch.float32).mean()
                for name, values in by_reward.items()
            },
        }
        stacked = torch.stack([value.float().to(scores.device) for value in local.values()])
        means = dict(zip(local, self.accelerator.reduce(stacked, "mean").tolist(), strict=True))
        means["objective/kl_coef"] = self.kl_coef
        means["reward"] = means["objective/scores"]
        for key, value in means.items():
            self.logged[key].append(value)
        if self.args.kl_target is not None:
            samples = self.args.rollout_batch_size * self.args.world_size
            self.kl_coef = adaptive_kl_coef(
                self.kl_coef, means["objective/kl"], self.args.kl_target, samples, self.args.kl_horizon
            )

    def time_split(self) -> dict[str, float]:
        """Seconds of the last `train()` spent generating rollouts, scoring them (rewards, and the policy,
        critic and reference forwards), and updating (the PPO epochs, and the Trainer's own work)."""
        return time_split(self, self.seconds["generate"], self.seconds["score"])

    # --- the update ---

    def compute_loss(
        self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False, **_: Any
    ):
        start = self.rollout.prompt_length
        logits, values = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        span = slice(start - 1, -1)
        losses = ppo_losses(
            log_probs=token_log_probs(logits[:, span], inputs["input_ids"][:, start:], self.args.temperature),
            old_log_probs=inputs["old_log_probs"],
            advantages=inputs["advantages"],
            values=values[:, span].float(),
            old_values=inputs["old_values"],
            returns=inputs["returns"],
            mask=inputs["completion_mask"],
            cliprange=self.args.cliprange,
            cliprange_value=self.args.cliprange_value,
            vf_coef=self.args.vf_coef,
        )
        for key, value in (
            ("loss/policy_avg", losses.policy),
            ("loss/value_avg", losses.value),
            ("policy/clipfrac_avg", losses.clip_fraction),
            ("policy/approxkl_avg", losses.approx_kl),
            ("val/clipfrac_avg", losses.value_clip_fraction),
        ):
            self.logged[key].append(float(value.detach()))
        return (losses.total, None) if return_outputs else losses.total

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add the PPO statistics gathered since the last log (each rank logs the same keys)."""
        if self.logged:
            keys = sorted(self.logged)
            local = torch.tensor(
                [sum(self.logged[k]) / len(self.logged[k]) for k in keys], device=self.args.device
            )
            logs = {**logs, **dict(zip(keys, self.accelerator.reduce(local, "mean").tolist(), strict=True))}
            self.logged.clear()
        super().log(logs, start_time)

    # --- saving: the policy as plain transformers/peft files, the critic beside it ---

    def write_model(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write the policy with `save_pretrained` (every rank joins, a sharded one gathers) and the critic's
        head as `value_head.pt`; PEFT writes the value adapter, if any, in `value/`."""
        output_dir = output_dir or self.args.output_dir
        wrapper = self.accelerator.unwrap_model(self.model)
        wrapper.policy.save_pretrained(output_dir, is_main_process=self.args.should_save)
        if self.args.should_save:
            os.makedirs(output_dir, exist_ok=True)
            ppo_checkpoint.save_value_head(wrapper.value_head, output_dir)
            self.processing_class.save_pretrained(output_dir)

    # --- resuming: the weights from align's layout, and PPO's own state (see ppo_checkpoint) ---

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        """The Trainer restores weights, optimizer, scheduler, RNG and skips the batches trained on; PPO's
        own state (KL coefficient, counters, the rollout in progress) is read here first."""
        if resume_from_checkpoint is True:  # none found: the Trainer raises
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir) or True
        if isinstance(resume_from_checkpoint, str):
            self.load_ppo_state(resume_from_checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def before_checkpoint(self, folder: str) -> None:
        """This rank's PPO state goes in first, so a folder with `trainer_state.json` is complete."""
        ppo_checkpoint.save_state(folder, self.args.process_index, self.ppo_state())

    def load_checkpoint_weights(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """The policy and the critic as `_save` wrote them (the Trainer's loader expects one model)."""
        wrapper = self.accelerator.unwrap_model(model or self.model)
        if hasattr(wrapper.policy, "peft_config"):
            ppo_checkpoint.load_adapters(wrapper.policy, resume_from_checkpoint)
        else:
            ppo_checkpoint.load_full_weights(wrapper.policy, resume_from_checkpoint)
        ppo_checkpoint.load_value_head(wrapper.value_head, resume_from_checkpoint)

    def ppo_state(self) -> dict[str, Any]:
        """What PPO carries from step to step besides the weights; the rollout only inside one."""
        inside = self.micro_steps % self.args.micro_batches_per_rollout != 0
        return {
            "kl_coef": self.kl_coef,
            "micro_steps": self.micro_steps,
            "shuffle": self.shuffle.get_state(),
            "logged": dict(self.logged),
            "rollout": self.rollout.tensors if inside else None,
            "prompt_length": self.rollout.prompt_length if inside else 0,
            "schedule": self.schedule if inside else [],
        }

    def load_ppo_state(self, folder: str) -> None:
        state = ppo_checkpoint.load_state(folder, self.args.process_index, self.args.device)
        self.kl_coef = state["kl_coef"]
        self.micro_steps = state["micro_steps"]
        self.shuffle.set_state(state["shuffle"].cpu())
        self.logged = defaultdict(list, state["logged"])
        self.rollout = Rollout(state["rollout"], state["prompt_length"]) if state["rollout"] else None
        self.schedule = state["schedule"]
