"""Values of the right type that cannot train (refused by their YAML path, before any model loads), and
values legal but almost surely a mistake (a warning line; validate goes on)."""

from tests.bad_inputs import Case, pipeline

SFT = "sft:\n  kind: sft\n  data: {train: align:chatterbot/sft/train}\n"
DPO = "dpo:\n  kind: dpo\n  data: {train: align:chatterbot/prefs/train}\n"
GRPO = (
    "grpo:\n  kind: grpo\n  data: {train: align:toy/number-or-word/train}\n"
    "  rewards:\n    - function: exact_answer\n"
)


def trl(stage: str, block: str) -> str:
    """A pipeline of one `stage` with the flow-style `trl:` block `block`."""
    return pipeline(f"{stage}  trl: {{{block}}}\n")


def refused(name: str, stage: str, block: str, *expect: str) -> Case:
    return Case(f"values-{name}", pipeline=trl(stage, block), expect=expect)


BATCH = "stages.sft.trl.per_device_train_batch_size"
CASES = [
    refused("batch-size-zero", SFT, "per_device_train_batch_size: 0", f"{BATCH}: 0 is below 1"),
    refused("batch-size-negative", SFT, "per_device_train_batch_size: -4", f"{BATCH}: -4 is below 1"),
    refused("batch-size-boolean", SFT, "per_device_train_batch_size: yes", f"{BATCH}: a number is needed"),
    refused(
        "batch-size-fraction",
        SFT,
        "per_device_train_batch_size: 2.5",
        f"{BATCH}: input should be a valid integer",
    ),
    refused(
        "eval-batch-size-zero",
        SFT,
        "per_device_eval_batch_size: 0",
        "stages.sft.trl.per_device_eval_batch_size: 0 is below 1",
    ),
    refused(
        "accumulation-zero",
        SFT,
        "gradient_accumulation_steps: 0",
        "stages.sft.trl.gradient_accumulation_steps: 0 is below 1: a step adds up at least one batch",
    ),
    refused(
        "accumulation-negative",
        DPO,
        "gradient_accumulation_steps: -2",
        "stages.dpo.trl.gradient_accumulation_steps",
    ),
    refused(
        "grpo-no-generations",
        GRPO,
        "num_generations: 0",
        "stages.grpo.trl.num_generations: 0 is below 2",
        "a group needs at least 2",
    ),
    refused(
        "grpo-one-generation", GRPO, "num_generations: 1", "stages.grpo.trl.num_generations: 1 is below 2"
    ),
    refused(
        "rloo-one-generation",
        GRPO.replace("grpo", "rloo"),
        "num_generations: 1",
        "stages.rloo.trl.num_generations: 1 is below 2",
    ),
    refused(
        "grpo-batch-not-a-multiple",
        GRPO,
        "num_generations: 4, per_device_train_batch_size: 3",
        "stages.grpo.trl: GRPOConfig rejected it",
        "num_generations",
    ),
    refused(
        "learning-rate-zero",
        SFT,
        "learning_rate: 0",
        "stages.sft.trl.learning_rate: 0 trains nothing",
    ),
    refused(
        "learning-rate-negative",
        SFT,
        "learning_rate: -0.1",
        "stages.sft.trl.learning_rate: -0.1 trains nothing",
    ),
    refused(
        "learning-rate-yes",
        SFT,
        "learning_rate: yes",
        "stages.sft.trl.learning_rate: a number is needed here, not the YAML boolean true",
    ),
    refused(
        "learning-rate-off", DPO, "learning_rate: off", "stages.dpo.trl.learning_rate:", "YAML boolean false"
    ),
    refused(
        "learning-rate-word", SFT, "learning_rate: fast", "stages.sft.trl.learning_rate:", "(got 'fast')"
    ),
    refused(
        "max-steps-unreachable",
        SFT,
        "max_steps: 100000000000000",
        "stages.sft.trl.max_steps: 100000000000000 steps is more than any run takes",
    ),
    refused("max-steps-1e23", SFT, "max_steps: 1.0e+23", "stages.sft.trl.max_steps:", "(got 1e+23)"),
    refused("max-steps-boolean", SFT, "max_steps: true", "stages.sft.trl.max_steps: a number is needed"),
    refused(
        "max-length-one",
        SFT,
        "max_length: 1",
        "stages.sft.trl.max_length: 1 is below 8",
        "a chat template's own tokens around one turn",
    ),
    refused("max-length-zero", DPO, "max_length: 0", "stages.dpo.trl.max_length: 0 is below 8"),
    refused(
        "max-completion-length-zero",
        GRPO,
        "max_completion_length: 0",
        "stages.grpo.trl.max_completion_length: 0 is below 1",
    ),
    refused(
        "epochs-word", SFT, "num_train_epochs: three", "stages.sft.trl.num_train_epochs:", "(got 'three')"
    ),
    refused("beta-boolean", DPO, "beta: yes", "stages.dpo.trl.beta: a number is needed"),
    refused("output-dir-owned", SFT, "output_dir: /tmp/out", "stages.sft.trl.output_dir: align sets this"),
    refused("seed-owned", SFT, "seed: 3", "stages.sft.trl.seed: align sets this; set defaults.seed"),
    refused("bf16-owned", SFT, "bf16: true", "stages.sft.trl.bf16: align sets this", "precision"),
    refused(
        "loss-type-a-number", DPO, "loss_type: 3", "stages.dpo.trl.loss_type: input should be a valid list"
    ),
    refused(
        "kto-batch-of-one",
        "kto:\n  kind: kto\n  data: {train: align:chatterbot/prefs/train}\n",
        "per_device_train_batch_size: 1",
        "stages.kto.trl:",
        "per_device_train_batch_size must be at least 2",
    ),
    refused(
        "reward-weights-in-trl",
        GRPO,
        "reward_weights: [1.0]",
        "stages.grpo.trl.reward_weights: set `weight:`",
    ),
    Case(
        "values-two-stages-at-once",
        pipeline=pipeline(
            f"{SFT}  trl: {{per_device_train_batch_size: 0}}\n{DPO}  trl: {{learning_rate: yes}}\n"
        ),
        expect=("2 problems", f"{BATCH}: 0 is below 1", "stages.dpo.trl.learning_rate: a number is needed"),
    ),
    Case(
        "values-learning-rate-above-one-warns",
        pipeline=trl(SFT, "learning_rate: 1.0e+9"),
        code=0,
        expect=("warning: stages.sft.trl.learning_rate: 1e+09 is above 1", "valid pipeline 'bad'"),
        lines=1,
    ),
]
