"""The stage graph and what spans stages: references, cycles, merges, reward models and functions,
eval stages and sweeps; and files with several independent problems, all named in one validate."""

from tests.bad_inputs import Case, pipeline

SFT = "sft:\n  kind: sft\n  data: {train: align:chatterbot/sft/train}\n"


def reading(name: str, kind: str, target: str, data: str = "align:chatterbot/sft/train") -> str:
    """A stage `name` of `kind` that starts from `${stages.TARGET.output}`."""
    return f"{name}:\n  kind: {kind}\n  model: ${{stages.{target}.output}}\n  data: {{train: {data}}}\n"


PREFS = "align:chatterbot/prefs/train"
PROMPTS = "align:toy/number-or-word/train"
SWEEP = "name: bad\nbase_model: tiny\nsweep:\n  metric: train/loss\n  mode: min\n{}\n"

CASES = [
    Case(
        "graph-unknown-reference",
        pipeline=pipeline(SFT + reading("dpo", "dpo", "stf", PREFS)),
        expect=("stages.dpo.model: refers to unknown stage 'stf'; stages: sft, dpo",),
    ),
    Case(
        "graph-self-reference",
        pipeline=pipeline(reading("sft", "sft", "sft")),
        expect=("stages.sft.model: a stage cannot consume its own output",),
    ),
    Case(
        "graph-cycle-of-two",
        pipeline=pipeline(reading("a", "sft", "b") + reading("b", "sft", "a")),
        expect=("stages.a: stages form a cycle: a -> b -> a",),
    ),
    Case(
        "graph-cycle-of-three",
        pipeline=pipeline(reading("a", "sft", "c") + reading("b", "sft", "a") + reading("c", "sft", "b")),
        expect=("stages form a cycle:", "a -> c -> b -> a"),
    ),
    Case(
        "graph-reference-inside-a-string",
        pipeline=pipeline(
            SFT + "dpo:\n  kind: dpo\n  model: ${stages.sft.output}/model\n  data: {train: " + PREFS + "}\n"
        ),
        expect=("stages.dpo.model: '${stages.sft.output}/model' is not a reference",),
    ),
    Case(
        "graph-reference-to-another-field",
        pipeline=pipeline(
            SFT + "dpo:\n  kind: dpo\n  model: ${stages.sft.model}\n  data: {train: " + PREFS + "}\n"
        ),
        expect=("stages.dpo.model: '${stages.sft.model}' is not a reference",),
    ),
    Case(
        "graph-merge-without-lora",
        pipeline=pipeline(SFT + "merge:\n  kind: merge\n  model: ${stages.sft.output}\n"),
        expect=("stages.merge.model: a merge stage needs an adapter",),
    ),
    Case(
        "graph-merge-of-a-builtin",
        pipeline=pipeline("merge:\n  kind: merge\n  model: tiny\n"),
        expect=("stages.merge.model: a merge stage needs an adapter",),
    ),
    Case(
        "graph-reward-model-from-an-sft-stage",
        pipeline=pipeline(
            SFT
            + f"grpo:\n  kind: grpo\n  data: {{train: {PROMPTS}}}\n"
            + "  rewards:\n    - model: ${stages.sft.output}\n"
        ),
        expect=("stages.grpo.rewards[0].model: refers to stage 'sft', a sft stage",),
    ),
    Case(
        "graph-reward-function-unknown",
        pipeline=pipeline(
            f"grpo:\n  kind: grpo\n  data: {{train: {PROMPTS}}}\n  rewards:\n    - function: exactanswer\n"
        ),
        expect=("stages.grpo.rewards[0].function:", "exactanswer"),
    ),
    Case(
        "graph-reward-function-own-code-not-allowed",
        pipeline=pipeline(
            f"grpo:\n  kind: grpo\n  data: {{train: {PROMPTS}}}\n  rewards:\n    - function: mine.score\n"
        ),
        expect=("stages.grpo.rewards[0].function:", "allow_custom_code: true"),
    ),
    Case(
        "graph-grpo-without-rewards",
        pipeline=pipeline(f"grpo:\n  kind: grpo\n  data: {{train: {PROMPTS}}}\n"),
        expect=("stages.grpo.rewards: required key is missing",),
    ),
    Case(
        "graph-eval-baseline-unknown",
        pipeline=pipeline(
            SFT + "eval:\n  kind: eval\n  models:\n    sft: ${stages.sft.output}\n  baseline: base\n"
            "  data: {prompts: align:toy/number-or-word/test}\n  rewards: [{function: exact_answer}]\n"
        ),
        expect=("stages.eval:", "baseline 'base' is not one of models: sft"),
    ),
    Case(
        "graph-eval-model-unknown-stage",
        pipeline=pipeline(
            SFT + "eval:\n  kind: eval\n  models:\n    dpo: ${stages.dpo.output}\n"
            "  data: {prompts: align:toy/number-or-word/test}\n  rewards: [{function: exact_answer}]\n"
        ),
        expect=("stages.eval.models.dpo: refers to unknown stage 'dpo'",),
    ),
    Case(
        "graph-reference-to-a-broken-stage-waits",
        pipeline=pipeline(
            "sft:\n  kind: sft\n  data: {train: align:chatterbot/sft/train}\n  lora: {r: many}\n"
            + reading("dpo", "dpo", "sft", PREFS)
        ),
        expect=(
            "1 problem in",
            "stages.sft.lora.r:",
            "1 more check waits on these: stages.sft (models, data, references)",
        ),
    ),
    Case(
        "graph-top-level-problem-waits",
        pipeline=pipeline(SFT, header="base_model: tiny\n"),
        expect=("name: required key is missing", "1 more check waits on these: stages.sft"),
    ),
    Case(
        "graph-four-problems-at-once",
        pipeline=pipeline(
            SFT
            + "  trl: {max_step: 10}\n"
            + "sft2:\n  kind: sft\n  data: {train: no_such.jsonl}\n"
            + reading("dpo", "dpo", "stf", PREFS)
            + reading("a", "sft", "b")
            + reading("b", "sft", "a")
        ),
        expect=(
            "4 problems in the pipeline file",
            "stages.sft.trl.max_step: unknown SFTConfig field 'max_step'; did you mean 'max_steps'?",
            "stages.sft2.data.train:",
            "no_such.jsonl does not exist",
            "stages.dpo.model: refers to unknown stage 'stf'",
            "stages.a: stages form a cycle: a -> b -> a",
        ),
    ),
    Case(
        "graph-schema-value-and-model-at-once",
        pipeline=pipeline(
            "sft:\n  kind: sft\n  model: ./nowhere\n  data: {train: align:chatterbot/sft/train}\n  lr: 0.1\n"
            "  trl: {per_device_train_batch_size: 0}\n",
        ),
        expect=(
            "3 problems",
            "stages.sft.lr:",
            "as trl.learning_rate",
            "stages.sft.trl.per_device_train_batch_size: 0",
            "stages.sft.model:",
            "nowhere' is not a builtin model",
        ),
    ),
    Case(
        "graph-sweep-unknown-stage",
        pipeline=pipeline(SFT, header=SWEEP.format("  parameters:\n    stages.dpo.trl.beta: [0.1, 0.2]")),
        expect=("sweep.parameters", "dpo"),
    ),
    Case(
        "graph-sweep-bad-value",
        pipeline=pipeline(
            SFT, header=SWEEP.format("  parameters:\n    stages.sft.trl.learning_rate: [1.0e-5, yes]")
        ),
        expect=("sweep.parameters.stages.sft.trl.learning_rate[1]:", "a number is needed"),
    ),
    Case(
        "graph-sweep-and-stage-problems-at-once",
        pipeline=pipeline(
            SFT + "  trl: {max_step: 1}\n", header=SWEEP.format("  method: gird\n  parameters: {}")
        ),
        expect=("sweep.method:", "stages.sft.trl.max_step:"),
    ),
]
