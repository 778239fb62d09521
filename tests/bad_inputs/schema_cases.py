"""Keys and types: what is missing, unknown, misplaced or of the wrong type, each named by its YAML path."""

from tests.bad_inputs import Case, pipeline

SFT = "sft:\n  kind: sft\n  data: {train: align:chatterbot/sft/train}\n"


def sft(extra: str) -> str:
    """A valid SFT stage with `extra` lines under it."""
    return pipeline(SFT + extra)


CASES = [
    Case(
        "schema-missing-name",
        pipeline=pipeline(SFT, header="base_model: tiny\n"),
        expect=("name: required key is missing",),
    ),
    Case(
        "schema-missing-base-model",
        pipeline=pipeline(SFT, header="name: bad\n"),
        expect=("base_model: required key is missing",),
    ),
    Case(
        "schema-missing-stages",
        pipeline="name: bad\nbase_model: tiny\n",
        expect=("stages: required key is missing",),
    ),
    Case(
        "schema-empty-stages",
        pipeline="name: bad\nbase_model: tiny\nstages: {}\n",
        expect=("stages: dictionary should have at least 1 item",),
    ),
    Case(
        "schema-stages-a-list",
        pipeline="name: bad\nbase_model: tiny\nstages: [sft]\n",
        expect=("stages: input should be a valid dictionary",),
    ),
    Case(
        "schema-name-with-spaces",
        pipeline=pipeline(SFT, header="name: my run\nbase_model: tiny\n"),
        expect=("name: string should match pattern",),
    ),
    Case(
        "schema-unknown-top-key",
        pipeline=pipeline(SFT, header="name: bad\nbase_model: tiny\nseed: 1\n"),
        expect=("seed: unknown key 'seed'",),
    ),
    Case(
        "schema-unknown-defaults-key",
        pipeline=pipeline(SFT, header="name: bad\nbase_model: tiny\ndefaults: {sede: 1}\n"),
        expect=("defaults.sede: unknown key 'sede'; did you mean 'seed'?",),
    ),
    Case(
        "schema-defaults-workers-zero",
        pipeline=pipeline(SFT, header="name: bad\nbase_model: tiny\ndefaults: {workers: 0}\n"),
        expect=("defaults.workers: input should be greater than 0 (got 0)",),
    ),
    Case(
        "schema-defaults-precision-unknown",
        pipeline=pipeline(SFT, header="name: bad\nbase_model: tiny\ndefaults: {precision: bf32}\n"),
        expect=("defaults.precision: input should be 'auto', 'fp32', 'bf16', 'bf16-pure' or 'fp16'",),
    ),
    Case(
        "schema-allow-custom-code-word",
        pipeline=pipeline(SFT, header="name: bad\nbase_model: tiny\nallow_custom_code: sometimes\n"),
        expect=("allow_custom_code: input should be a valid boolean",),
    ),
    Case(
        "schema-stage-not-a-mapping",
        pipeline=pipeline("sft: yes\n"),
        expect=("stages.sft: a stage must be a mapping with at least `kind`",),
    ),
    Case(
        "schema-stage-without-kind",
        pipeline=pipeline("sft:\n  data: {train: align:chatterbot/sft/train}\n"),
        expect=("stages.sft.kind: None is not a stage kind",),
    ),
    Case(
        "schema-unknown-kind",
        pipeline=pipeline("sft:\n  kind: stf\n"),
        expect=("stages.sft.kind: 'stf' is not a stage kind",),
    ),
    Case(
        "schema-kind-a-list",
        pipeline=pipeline("sft:\n  kind: [sft]\n"),
        expect=("stages.sft.kind: ['sft'] is not a stage kind",),
    ),
    Case(
        "schema-stage-name-with-dot",
        pipeline=pipeline(SFT.replace("sft:", "s.f.t:", 1)),
        expect=("stages.s.f.t", "string should match pattern", "1 more check waits on these: stages.s.f.t"),
    ),
    Case(
        "schema-unknown-stage-key",
        pipeline=sft("  modle: tiny\n"),
        expect=("stages.sft.modle: unknown key 'modle'; did you mean 'model'?",),
    ),
    Case(
        "schema-stage-lr",
        pipeline=sft("  lr: 1.0e-5\n"),
        expect=(
            "stages.sft.lr: unknown key 'lr'; TRL settings go in the stage's trl: block",
            "as trl.learning_rate",
        ),
    ),
    Case(
        "schema-stage-epochs",
        pipeline=sft("  epochs: 3\n"),
        expect=("stages.sft.epochs:", "as trl.num_train_epochs"),
    ),
    Case(
        "schema-stage-batch-size",
        pipeline=sft("  batch_size: 8\n"),
        expect=("stages.sft.batch_size:", "as trl.per_device_train_batch_size"),
    ),
    Case(
        "schema-stage-max-steps",
        pipeline=sft("  max_steps: 10\n"),
        expect=("stages.sft.max_steps:", "as trl.max_steps"),
    ),
    Case(
        "schema-stage-beta",
        pipeline=pipeline("dpo:\n  kind: dpo\n  data: {train: align:chatterbot/prefs/train}\n  beta: 0.1\n"),
        expect=("stages.dpo.beta:", "as trl.beta"),
    ),
    Case(
        "schema-stage-max-seq-length",
        pipeline=sft("  max_seq_length: 512\n"),
        expect=("stages.sft.max_seq_length:", "as trl.max_length"),
    ),
    Case(
        "schema-missing-data",
        pipeline=pipeline("sft:\n  kind: sft\n"),
        expect=("stages.sft.data: required key is missing",),
    ),
    Case(
        "schema-data-without-train",
        pipeline=pipeline("sft:\n  kind: sft\n  data: {eval: align:chatterbot/sft/test}\n"),
        expect=("stages.sft.data.train: required key is missing",),
    ),
    Case(
        "schema-trl-not-a-mapping",
        pipeline=sft("  trl: [max_steps, 10]\n"),
        expect=("stages.sft.trl: input should be a valid dictionary",),
    ),
    Case("schema-lora-r-word", pipeline=sft("  lora: {r: many}\n"), expect=("stages.sft.lora.r:", "'many'")),
    Case(
        "schema-lora-r-boolean",
        pipeline=sft("  lora: {r: yes}\n"),
        expect=("stages.sft.lora.r:", "a number is needed here, not the YAML boolean true"),
    ),
    Case(
        "schema-lora-dropout-above-one",
        pipeline=sft("  lora: {dropout: 1.5}\n"),
        expect=("stages.sft.lora.dropout: input should be less than 1 (got 1.5)",),
    ),
    Case(
        "schema-lora-unknown-key",
        pipeline=sft("  lora: {rank: 8}\n"),
        expect=("stages.sft.lora.rank: unknown key 'rank'",),
    ),
    Case(
        "schema-lora-no-targets",
        pipeline=sft("  lora: {target_modules: []}\n"),
        expect=("stages.sft.lora.target_modules:", "name at least one module"),
    ),
    Case(
        "schema-workers-boolean",
        pipeline=sft("  workers: yes\n"),
        expect=("stages.sft.workers:", "not the YAML boolean true"),
    ),
    Case(
        "schema-workers-negative",
        pipeline=sft("  workers: -2\n"),
        expect=("stages.sft.workers: input should be greater than 0",),
    ),
    Case(
        "schema-checkpoint-minutes-boolean",
        pipeline=sft("  checkpoint_minutes: off\n"),
        expect=("stages.sft.checkpoint_minutes:", "not the YAML boolean false"),
    ),
    Case(
        "schema-max-failures-negative",
        pipeline=sft("  max_failures: -1\n"),
        expect=("stages.sft.max_failures: input should be greater than or equal to 0",),
    ),
    Case(
        "schema-unknown-backend",
        pipeline=sft("  backend: zero3\n"),
        expect=("stages.sft.backend: 'zero3' is not a backend",),
    ),
    Case(
        "schema-resources-unknown-strategy",
        pipeline=sft("  resources: {strategy: scatter}\n"),
        expect=("stages.sft.resources.strategy:",),
    ),
    Case(
        "schema-zero2-bucket-odd",
        pipeline=sft("  zero2: {bucket_size: 3}\n"),
        expect=("stages.sft.zero2.bucket_size: input should be a multiple of 2",),
    ),
    Case(
        "schema-merge-takes-no-trl",
        pipeline=pipeline("merge:\n  kind: merge\n  trl: {max_steps: 1}\n"),
        expect=("stages.merge.trl: unknown key 'trl'",),
    ),
    Case(
        "schema-eval-without-models",
        pipeline=pipeline("eval:\n  kind: eval\n  lm_eval: {tasks: [hellaswag]}\n"),
        expect=("stages.eval.models: required key is missing",),
    ),
]
