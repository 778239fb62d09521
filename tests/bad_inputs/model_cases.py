"""Models that are not there or are not models: missing folders, folders without config.json, files, code
that ships with a model, hub ids that are not in the local cache while the hub is off (tests run with
HF_HUB_OFFLINE=1): each named with its YAML path and the way out, before anything loads or Ray starts."""

import json

from tests.bad_inputs import Case, pipeline

SFT = "sft:\n  kind: sft\n  data: {train: align:chatterbot/sft/train}\n"
ABSENT = "org-not-here/model-not-here"
NOT_CACHED = f"'{ABSENT}' is not in the local Hugging Face cache and the hub is off here (HF_HUB_OFFLINE=1)"
CONFIG = json.dumps({"model_type": "llama"})


def based_on(model: str, stages: str = SFT) -> str:
    return pipeline(stages, header=f"name: bad\nbase_model: {model}\n")


CASES = [
    Case(
        "model-missing-folder",
        pipeline=based_on("./no/such/model"),
        expect=("base_model:", "no/such/model' is not a builtin model, a folder, or a hub id"),
    ),
    Case(
        "model-missing-stage-folder",
        pipeline=pipeline(SFT.replace("  data:", "  model: ../gone\n  data:")),
        expect=("stages.sft.model:", "gone' is not a builtin model, a folder, or a hub id"),
    ),
    Case(
        "model-unknown-builtin",
        pipeline=based_on("tiny2"),
        expect=(
            "base_model: '",
            "/tiny2' is not a builtin model, a folder, or a hub id",
            "(tiny, smollm2-135m)",
        ),
    ),
    Case(
        "model-a-file",
        pipeline=based_on("./weights.bin"),
        files={"weights.bin": "not a model"},
        expect=("base_model:", "weights.bin' is a file, not a model folder"),
    ),
    Case(
        "model-folder-without-config",
        pipeline=based_on("./empty_model"),
        files={"empty_model/README.md": "soon"},
        expect=("base_model: the folder", "empty_model' has no config.json, so it is not a model folder"),
    ),
    Case(
        "model-folder-with-tokenizer-only",
        pipeline=based_on("./tok"),
        files={"tok/tokenizer_config.json": "{}", "tok/tokenizer.json": "{}"},
        expect=("base_model: the folder", "tok' has no config.json"),
    ),
    Case(
        "model-stage-folder-without-config",
        pipeline=pipeline(SFT.replace("  data:", "  model: ./half\n  data:")),
        files={"half/model.safetensors": ""},
        expect=("stages.sft.model: the folder", "half' has no config.json"),
    ),
    Case(
        "model-org-folder-typo",
        pipeline=based_on("models/missing"),
        files={"models/other/config.json": CONFIG},
        expect=("base_model:", "models/missing' is not a builtin model, a folder, or a hub id"),
    ),
    Case(
        "model-custom-code-auto-map",
        pipeline=based_on("./custom"),
        files={"custom/config.json": json.dumps({"model_type": "llama", "auto_map": {"AutoModel": "x.Y"}})},
        expect=("base_model:", "needs code of its own", "allow_custom_code: true"),
    ),
    Case(
        "model-unknown-model-type",
        pipeline=based_on("./strange"),
        files={"strange/config.json": json.dumps({"model_type": "frobnicator"})},
        expect=("base_model:", "model_type 'frobnicator'", "does not know"),
    ),
    Case(
        "model-hub-id-not-cached-at-data",
        argv=("data", "{pipeline}"),
        pipeline=based_on(ABSENT),
        expect=(f"base_model: {NOT_CACHED}", f"`hf download {ABSENT}`", "unset HF_HUB_OFFLINE"),
    ),
    Case(
        "model-hub-id-not-cached-at-run",
        argv=("run", "{pipeline}"),
        pipeline=based_on(ABSENT),
        expect=(f"base_model: {NOT_CACHED}",),
    ),
    Case(
        "model-stage-hub-id-not-cached-at-data",
        argv=("data", "{pipeline}"),
        pipeline=pipeline(SFT.replace("  data:", f"  model: {ABSENT}\n  data:")),
        expect=(f"stages.sft.model: {NOT_CACHED}",),
    ),
    Case(
        "model-hub-id-not-cached-warns-at-validate",
        pipeline=based_on(ABSENT),
        code=0,
        expect=(f"warning: base_model: {NOT_CACHED}", "valid pipeline 'bad'"),
        lines=1,
    ),
    Case(
        "model-unknown-chat-template",
        pipeline=pipeline(SFT, header="name: bad\nbase_model: tiny\nchat_template: chatmlx\n"),
        expect=("chat_template:", "chatmlx"),
    ),
    Case(
        "model-distill-teacher-missing",
        pipeline=pipeline(
            "distill:\n  kind: distill\n  data: {train: align:toy/number-or-word/train}\n"
            "  teacher: ./no_teacher\n"
        ),
        expect=("stages.distill.teacher", "no_teacher' is not a builtin model, a folder, or a hub id"),
    ),
    Case(
        "model-reward-model-missing",
        pipeline=pipeline(
            "grpo:\n  kind: grpo\n  data: {train: align:toy/number-or-word/train}\n"
            "  rewards:\n    - model: ./no_rm\n"
        ),
        expect=("stages.grpo.rewards[0].model:", "no_rm' is not a builtin model"),
    ),
    Case(
        "model-eval-model-missing",
        pipeline=pipeline(
            "eval:\n  kind: eval\n  models: {base: tiny, other: ./no_such}\n"
            "  data: {prompts: align:toy/number-or-word/test}\n"
            "  rewards: [{function: exact_answer}]\n"
        ),
        expect=("stages.eval.models.other:", "no_such' is not a builtin model"),
    ),
]
