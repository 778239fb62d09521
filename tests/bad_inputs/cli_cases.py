"""The command line itself: unknown commands and options, bad option values, pipeline files that cannot
be read, and `--set` overrides that do not say a key and a value."""

from tests.bad_inputs import Case, pipeline

VALID = pipeline("sft:\n  kind: sft\n  data: {train: align:chatterbot/sft/train}\n")

CASES = [
    Case("no-command", argv=(), expect=("required",)),
    Case("unknown-command", argv=("trian", "x.yaml"), expect=("invalid choice: 'trian'",)),
    Case("validate-without-file", argv=("validate",), expect=("required: file",)),
    Case(
        "unknown-option",
        argv=("validate", "{pipeline}", "--frobnicate"),
        pipeline=VALID,
        expect=("unrecognized arguments: --frobnicate",),
    ),
    Case(
        "chat-temperature-not-a-number",
        argv=("chat", "tiny", "--temperature", "hot"),
        expect=("--temperature", "invalid float value: 'hot'"),
    ),
    Case(
        "submit-without-address",
        argv=("submit", "{pipeline}"),
        pipeline=VALID,
        expect=("required: --address",),
    ),
    Case(
        "pack-limit-not-a-size",
        argv=("submit", "{pipeline}", "--address", "http://x:8265", "--pack-limit", "lots"),
        pipeline=VALID,
        expect=("--pack-limit", "'lots' is not a size"),
    ),
    Case(
        "chat-max-tokens-not-a-number",
        argv=("chat", "tiny", "--max-new-tokens", "ten"),
        expect=("--max-new-tokens", "invalid int value: 'ten'"),
    ),
    Case(
        "pipeline-file-missing",
        argv=("validate", "absent.yaml"),
        expect=("absent.yaml: cannot read the pipeline file: No such file or directory",),
    ),
    Case(
        "pipeline-file-is-a-folder",
        argv=("validate", "{dir}"),
        expect=("cannot read the pipeline file: Is a directory",),
    ),
    Case(
        "plan-file-missing",
        argv=("plan", "absent.yaml"),
        expect=("absent.yaml: cannot read the pipeline file",),
    ),
    Case(
        "run-file-missing",
        argv=("run", "absent.yaml"),
        expect=("absent.yaml: cannot read the pipeline file",),
    ),
    Case(
        "set-without-equals",
        argv=("validate", "{pipeline}", "--set", "nonsense"),
        pipeline=VALID,
        expect=("--set nonsense: expected key.path=value",),
    ),
    Case(
        "set-without-key",
        argv=("validate", "{pipeline}", "--set", "=1"),
        pipeline=VALID,
        expect=("--set =1: expected key.path=value",),
    ),
    Case(
        "set-value-not-yaml",
        argv=("validate", "{pipeline}", "--set", "stages.sft.trl.max_steps=["),
        pipeline=VALID,
        expect=("--set stages.sft.trl.max_steps=[: the value is not valid YAML",),
    ),
    Case(
        "set-under-a-value",
        argv=("validate", "{pipeline}", "--set", "stages.sft.data.train.deeper=1"),
        pipeline=VALID,
        expect=("stages.sft.data.train: --set stages.sft.data.train.deeper: this is not a mapping",),
    ),
    Case(
        "set-unknown-trl-key",
        argv=("validate", "{pipeline}", "--set", "stages.sft.trl.max_step=5"),
        pipeline=VALID,
        expect=("stages.sft.trl.max_step: unknown SFTConfig field 'max_step'; did you mean 'max_steps'?",),
    ),
    Case(
        "set-boolean-learning-rate",
        argv=("validate", "{pipeline}", "--set", "stages.sft.trl.learning_rate=yes"),
        pipeline=VALID,
        expect=("stages.sft.trl.learning_rate: a number is needed here, not the YAML boolean true",),
    ),
    Case(
        "set-unknown-stage-key",
        argv=("validate", "{pipeline}", "--set", "stages.sft.modle=tiny"),
        pipeline=VALID,
        expect=("stages.sft.modle: unknown key 'modle'; did you mean 'model'?",),
    ),
    Case(
        "status-of-a-missing-file",
        argv=("status", "absent.yaml"),
        expect=("absent.yaml: no such pipeline file or run folder",),
    ),
    Case(
        "report-of-a-missing-folder",
        argv=("report", "runs/absent"),
        expect=("runs/absent: no such pipeline file or run folder",),
    ),
]
