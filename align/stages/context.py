"""What a stage runner receives and returns, and the loading steps every runner shares."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from align.backends import BACKENDS, Backend
from align.config.secrets import is_secret_name
from align.data.mixtures import StageRows, stage_rows
from align.errors import StageFailed
from align.models.architectures import LoraTargets
from align.models.chat_templates import apply as apply_template
from align.models.chat_templates import fit_model, template_token_ids
from align.models.loading import load_causal_lm, load_tokenizer
from align.models.precision import compute_dtype
from align.pipeline.trl_args import build_config
from align.planning.launch import Launch
from align.planning.placement import REFERENCE_COPY
from align.planning.plan import ModelInput, StageInputs, StagePlan
from align.stages.checkpointing import checkpoint_callbacks
from align.stages.checkpoints import CHECKPOINTS, KEEP
from align.stages.lm_head import lm_head_callbacks
from align.stages.progress import ProgressFile
from align.stages.resident import ReleaseMappedPages

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StageContext:
    """One rank's view of a stage: its plan, what the driver added when it started it (`launch`: its input
    folders, its config with hub data pinned), where to write, and its backend."""

    plan: StagePlan
    output_dir: Path
    rank: int = 0
    backend: Backend | None = None  # the plan's, unless a caller wraps it (bench/probe.py measures it)
    resume_from: Path | None = None  # a complete checkpoint of an earlier attempt, chosen by the driver
    services: dict[str, Any] = field(default_factory=dict)
    """A client per frozen model the plan places in an actor of its own, by role (`rewards[0]`,
    `reference`): align/stages/services.py says what each answers."""
    started: float = field(default_factory=time.perf_counter)  # the rank took up the stage: its cost starts
    launch: Launch | None = None  # None: a context made from a plan alone, which reads no inputs

    def __post_init__(self) -> None:
        if self.backend is None:
            object.__setattr__(self, "backend", BACKENDS[self.plan.backend])

    @property
    def inputs(self) -> StageInputs:
        """The folders the stage reads, resolved by the driver when it started the stage."""
        return self.launch.inputs

    @property
    def model_input(self) -> ModelInput:
        return self.inputs.model

    def with_model(self, model: ModelInput) -> StageContext:
        """This context reading another input model (a merged folder, a shorter adapter chain)."""
        inputs = replace(self.inputs, model=model)
        return replace(self, launch=replace(self.launch, inputs=inputs))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: of frozen models, and of a LoRA base."""
        return DTYPES[compute_dtype(self.plan.precision)]

    @property
    def load_dtype(self) -> torch.dtype:
        """The dtype the stage's own model loads in: the compute dtype under LoRA (the base is frozen),
        else the dtype its trained weights are held in (fp32 under mixed precision on ddp and fsdp)."""
        if self.plan.lora is not None:
            return self.dtype
        return DTYPES[self.plan.trainable_dtype]

    def callbacks(self) -> list[Any]:
        """The backend's trainer callbacks, writing under the stage's logs/, then align's: the plan's LM-head
        path, the progress file, and the checkpoint timer and completion marker (last, once the backend has
        saved its part)."""
        logs = self.output_dir / "logs"
        return [
            *self.backend.callbacks(self.plan, logs),
            *lm_head_callbacks(self.plan),
            ProgressFile(logs),
            ReleaseMappedPages(),
            *checkpoint_callbacks(self.plan.checkpoint_minutes),
        ]

    @property
    def device(self) -> torch.device:
        """The training device of this rank: its GPU, or the CPU."""
        if self.plan.accelerator:
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")

    def device_map(self) -> str | dict[str, int]:
        """Where 4-bit weights go at load time: this rank's GPU, or the CPU when the plan has none."""
        return {"": int(os.environ.get("LOCAL_RANK", "0"))} if self.plan.accelerator else "cpu"


def load_stage_model(
    ctx: StageContext, *, quantize_4bit: bool = False, frozen: bool = False, tokenizer: Any = None
) -> torch.nn.Module:
    """The input model with its earlier adapters merged in, loaded the way the backend asks: in the dtype
    the stage trains it in, or, `frozen`, in the compute dtype. Its embeddings fit `tokenizer` (by default
    the input's own), which may hold a template's tokens the base never had."""
    kwargs = {
        "dtype": ctx.dtype if frozen else ctx.load_dtype,
        "trust_remote_code": ctx.plan.remote_code,
        **ctx.backend.model_kwargs(ctx.plan),
    }
    if quantize_4bit:
        kwargs["device_map"] = ctx.device_map()
    model = load_causal_lm(ctx.model_input.base, quantize_4bit=quantize_4bit, **kwargs)
    tokenizer = tokenizer or stage_tokenizer(ctx)
    rows = model.get_input_embeddings().num_embeddings
    if ctx.backend.frozen_sharded and rows < len(tokenizer):
        raise StageFailed(
            f"{ctx.plan.where}: the tokenizer has {len(tokenizer)} tokens and the model's embeddings {rows} "
            "rows; FSDP shards the model as it loads and cannot add rows to it: train this stage under "
            "`backend: zero2` or `ddp`, or start it from an earlier stage's merged model, which has them"
        )
    fit_model(model, tokenizer, ctx.plan.chat_template)
    return ctx.backend.prepare(merge_adapters(model, ctx.model_input.adapters), ctx.plan)


def merge_adapters(model: torch.nn.Module, adapters: tuple[str, ...]) -> torch.nn.Module:
    """`model` with each adapter folder merged into it, in order."""
    if adapters:
        from peft import PeftModel

        for adapter in adapters:
            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return model


def frozen_reference(ctx: StageContext) -> torch.nn.Module | None:
    """The reference model when the plan places a frozen copy (full parameters), loaded and placed like
    the policy (sharded under fsdp); None when there is none to load (LoRA disables the adapters)."""
    if ctx.plan.placement.reference != REFERENCE_COPY:
        return None
    return on_training_device(ctx, load_stage_model(ctx, frozen=True).requires_grad_(False).eval())


def on_training_device(
    ctx: StageContext, model: torch.nn.Module, device: torch.device | None = None
) -> torch.nn.Module:
    """A model a stage runs forwards through, on the training device: a frozen one (reference copy, reward
    model), which the Trainer never moves, and the trained one before `train()`, where ZeRO-2 has not moved
    it yet, so that what is measured before training runs where what is measured after does.

    A backend that shards its models (fsdp) placed them on the ranks' devices when it sharded them, and a
    model already there (a 4-bit one is placed as it loads) stays as it is. `device` defaults to this
    rank's training device."""
    device = device or ctx.device
    if ctx.backend.frozen_sharded or all(tensor.device == device for tensor in model.parameters()):
        return model
    return model.to(device)


def stage_tokenizer(ctx: StageContext, *, padding_side: str = "right"):
    """The input model's tokenizer (saved beside every adapter and model align writes), with the stage's
    chat template applied when it has one."""
    source = ctx.model_input.adapters[-1] if ctx.model_input.adapters else ctx.model_input.base
    tokenizer = load_tokenizer(source, trust_remote_code=ctx.plan.remote_code)
    if ctx.plan.chat_template is not None:
        apply_template(ctx.plan.chat_template, tokenizer)
    tokenizer.padding_side = padding_side
    return tokenizer


def peft_config(plan: StagePlan, tokenizer: Any = None, model: Any = None):
    """PEFT's LoraConfig for a stage's `lora:` block, on the targets the plan resolved against the model
    (MoE weights through `target_parameters`); TRL applies it and handles 4-bit preparation. With a chat
    template and the stage's `tokenizer`, the embedding rows of the template's special tokens train too, where
    the plan says they do (align/planning/lora.py): in the input embeddings, and in `model`'s LM head too
    when it is untied."""
    lora = plan.lora
    if lora is None:
        return None
    from peft import LoraConfig

    targets = plan.lora_targets or LoraTargets(lora.target_modules)  # a plan built before resolving
    trains_rows = plan.lm_head is not None and plan.lm_head.template_rows
    rows = template_token_ids(plan.chat_template, tokenizer) if trains_rows else []
    modules = targets.modules if isinstance(targets.modules, str) else list(targets.modules)
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha or 2 * lora.r,
        lora_dropout=lora.dropout,
        target_modules=modules or None,
        target_parameters=list(targets.parameters) or None,
        trainable_token_indices=token_rows_by_module(model, rows) or None,
        task_type="CAUSAL_LM",
    )


def token_rows_by_module(model: Any, rows: list[int]) -> list[int] | dict[str, list[int]]:
    """peft's `trainable_token_indices`: the rows, in the input embeddings only (a tied head shares them),
    or by module name in both the input embeddings and an untied LM head."""
    head = model.get_output_embeddings() if rows and model is not None else None
    embeddings = model.get_input_embeddings() if head is not None else None
    if head is None or head.weight is embeddings.weight:
        return rows
    names = {module: name.rpartition(".")[2] for name, module in model.named_modules()}
    return {names[embeddings]: rows, names[head]: rows}


def loaded_rows(ctx: StageContext) -> StageRows:
    return stage_rows(ctx.launch.stage.data, ctx.plan.data_kind, ctx.plan.seed, ctx.plan.where)  # pinned


def stage_data(ctx: StageContext, rows: StageRows | None = None) -> tuple[Any, Any]:
    """Train and held-out datasets of the plan's data kind, trimmed to the row limits the stage sets, from
    its one source or its mixture (align/data/mixtures.py: `stage_rows` also names each row's source).

    Without an eval split, a deterministic slice of each source's rows (5%, at most 64) is held out of
    training and measured instead: numbers called held out never come from rows trained on. `eval: none`
    turns the held-out measurement off. `rows`: the stage's rows when already loaded (`loaded_rows`)."""
    rows = rows or loaded_rows(ctx)
    return explicit_prompt(rows.train), None if rows.held_out is None else explicit_prompt(rows.held_out)


CHECKPOINT_DEFAULTS = {"save_total_limit": KEEP}
"""Unless the `trl:` block says otherwise: keep the last two complete checkpoints, not every one."""
REPORT_DEFAULTS = {"report_to": ["tensorboard"]}
"""Unless the `trl:` block sets `report_to` (W&B, MLflow... as in TRL, their keys from the environment):
TensorBoard event files under the stage's `logs/tensorboard/`."""
TENSORBOARD_FOLDER = "tensorboard"


def explicit_prompt(dataset: Any) -> Any:
    """Preference pairs with an implicit prompt (the shared start of `chosen` and `rejected`, TRL's format)
    split as TRL splits them, so the trainer and align's held-out scoring read the same prompt."""
    if "prompt" in dataset.column_names or "chosen" not in dataset.column_names:
        return dataset
    from trl.data_utils import maybe_extract_prompt

    return dataset.map(maybe_extract_prompt)


def stage_config(ctx: StageContext, overrides: dict[str, Any] | None = None) -> Any:
    """TRL's config for this stage: its `trl:` block (plus what the runner must set), and what align
    owns: outputs and TensorBoard events under the stage folder, precision, seed, device, and the backend's
    trainer arguments. Secrets leave the config (it is pickled into every checkpoint as training_args.bin)."""
    config = build_config(
        ctx.plan.kind,
        {**CHECKPOINT_DEFAULTS, **REPORT_DEFAULTS, **ctx.plan.trl, **(overrides or {})},
        output_dir=str(ctx.output_dir / CHECKPOINTS),
        precision=ctx.plan.precision,
        seed=ctx.plan.seed,
        accelerator=ctx.plan.accelerator,
        **ctx.backend.trainer_args(ctx.plan),
    )
    if "tensorboard" in config.report_to:
        # transformers' TensorBoard callback takes its folder from the environment only
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(ctx.output_dir / "logs" / TENSORBOARD_FOLDER)
    return without_secrets(config)


def without_secrets(config: Any) -> Any:
    """`config` with its secret-named string fields emptied; the hub token moves to this process's
    environment (`HF_TOKEN`), where the hub client looks for it, instead of into the pickle."""
    for item in fields(config):
        value = getattr(config, item.name)
        if isinstance(value, str) and value and is_secret_name(item.name):
            if item.name == "hub_token":
                os.environ.setdefault("HF_TOKEN", value)
            setattr(config, item.name, None)
    return config


@contextmanager
def merged_input(ctx: StageContext) -> Iterator[str]:
    """The input model as one folder: its base, or (with adapters) the merged model in a scratch folder.

    Loading by folder lets a head other than causal-LM be put on it, and lets TRL re-load a reference
    copy from `config._name_or_path`, which would otherwise name the base without the adapters.
    Each rank writes its own copy: no rank waits on another's disk.
    """
    if not ctx.model_input.adapters:
        yield ctx.model_input.base
        return
    base = load_causal_lm(ctx.model_input.base, dtype=ctx.load_dtype, trust_remote_code=ctx.plan.remote_code)
    model = merge_adapters(base, ctx.model_input.adapters)
    with tempfile.TemporaryDirectory(prefix=".merged-input-", dir=ctx.output_dir) as folder:
        model.save_pretrained(folder)
        del model
        yield folder
