"""The RL stages: reward model, GRPO, RLOO and PPO through the real CLI, and the checks on their rewards.

The integration run is one pipeline (about 3 minutes on 2 cores): the SFT, reward model and PPO stages of
pipelines/tiny_sft_rm_ppo.yaml as shipped (PPO against the learned reward only, rules tracked at weight
0), plus GRPO from the same SFT model, and RLOO scored by rule rewards plus that reward model.
PPO on 2 ranks under each backend is in tests/test_ppo.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from align.cli import main
from align.data.corpora import build_toy
from align.rewards import (
    RewardError,
    exact_answer,
    format_match,
    guarded_function,
    json_fields,
    length_target,
)
from tests.pipelines import QUIET_TRL, run, stage_record

ROOT = Path(__file__).resolve().parents[1]

TOY = "align:toy/number-or-word"
RL_TRL = {
    **{key: value for key, value in QUIET_TRL.items() if key != "max_length"},
    "max_steps": 15,
    "learning_rate": 2e-3,
    "per_device_train_batch_size": 16,
    "num_generations": 8,
    "max_completion_length": 8,
}
RULES = [{"function": "exact_answer"}, {"function": "format"}]


def rl_stage(kind: str, rewards: list[dict], **fields) -> dict:
    data = {"train": f"{TOY}/train", "eval": f"{TOY}/test"}
    return {
        "kind": kind,
        "model": "${stages.sft.output}",
        "data": data,
        "rewards": rewards,
        "trl": RL_TRL,
        **fields,
    }


def sft_stage(steps: int = 40, batch: int = 32) -> dict:
    trl = {**QUIET_TRL, "max_steps": steps, "learning_rate": 1e-2, "per_device_train_batch_size": batch}
    return {"kind": "sft", "data": {"train": f"{TOY}/sft"}, "trl": {**trl, "assistant_only_loss": True}}


def write(folder: Path, stages: dict[str, dict], **top) -> Path:
    body = {"name": "rl", "base_model": "tiny", **top, "defaults": {"output_root": str(folder / "runs")}}
    path = folder / "rl.yaml"
    path.write_text(yaml.safe_dump({**body, "stages": stages}, sort_keys=False))
    return path


def validate(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str]:
    code = main(["validate", str(path)])
    return code, capsys.readouterr().err


# --- validate: what is refused before anything runs ---


def test_own_function_without_opt_in_is_refused_naming_path_and_opt_in(tmp_path, capsys) -> None:
    path = write(
        tmp_path, {"sft": sft_stage(), "grpo": rl_stage("grpo", [{"function": "mine.rewards.score"}])}
    )
    code, err = validate(capsys, path)
    assert code == 2
    assert "stages.grpo.rewards[0].function: 'mine.rewards.score' is a function of your own" in err
    assert "allow_custom_code: true" in err


def test_own_function_with_opt_in_is_imported_and_accepted(tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "opt_in_rewards.py").write_text(
        "def brevity(completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards = [{"function": "opt_in_rewards.brevity"}, {"function": "opt_in_rewards.missing"}]
    path = write(tmp_path, {"sft": sft_stage(), "grpo": rl_stage("grpo", rewards)}, allow_custom_code=True)
    code, err = validate(capsys, path)
    assert code == 2 and "1 problem" in err
    assert "stages.grpo.rewards[1].function: cannot load the reward function 'opt_in_rewards.missing'" in err


def test_reward_model_must_come_from_a_reward_stage(tmp_path, capsys) -> None:
    rewards = [{"model": "${stages.sft.output}"}]
    code, err = validate(capsys, write(tmp_path, {"sft": sft_stage(), "rloo": rl_stage("rloo", rewards)}))
    assert code == 2
    assert "stages.rloo.rewards[0].model: refers to stage 'sft', a sft stage" in err and "kind: reward" in err


def test_unknown_function_and_bad_args_are_all_reported(tmp_path, capsys) -> None:
    rewards = [
        {"function": "exact"},
        {"function": "length", "args": {"taget": 3}},
        {"function": "format", "args": {"pattern": "("}},
    ]
    code, err = validate(capsys, write(tmp_path, {"sft": sft_stage(), "grpo": rl_stage("grpo", rewards)}))
    assert code == 2
    shipped = "exact_answer, final_number, format, json_fields, length"
    assert f"rewards[0].function: 'exact' is not a shipped reward function ({shipped})" in err
    assert "rewards[1].args: length takes no argument 'taget'; it takes: target, unit" in err
    assert "rewards[2].args: format cannot run with these args" in err


def test_a_reward_names_one_source(tmp_path, capsys) -> None:
    rewards = [{"function": "format", "model": "tiny"}, {"weight": 2.0}]
    code, err = validate(capsys, write(tmp_path, {"sft": sft_stage(), "grpo": rl_stage("grpo", rewards)}))
    assert code == 2 and err.count("give exactly one of `function` (a reward function) or `model`") == 2


def test_vllm_generation_is_refused_where_vllm_is_not_installed(tmp_path, capsys, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    grpo = rl_stage("grpo", RULES)
    grpo["trl"] = {**grpo["trl"], "use_vllm": True}
    code, err = validate(capsys, write(tmp_path, {"sft": sft_stage(), "grpo": grpo}))
    assert code == 2 and "stages.grpo.trl.use_vllm: vLLM is not installed here" in err


def test_shipped_pipeline_is_valid(capsys) -> None:
    assert main(["validate", str(Path(__file__).parents[1] / "pipelines" / "tiny_grpo.yaml")]) == 0


# --- rewards at run time ---


def test_a_raising_reward_function_is_named_with_its_batch() -> None:
    reward = guarded_function("exact_answer", {}, "stages.grpo.rewards[0]")
    prompts = [[{"role": "user", "content": "Number or word? 7"}]] * 3
    with pytest.raises(RewardError) as caught:
        reward(prompts=prompts, completions=["number"] * 3)  # no `answer` column
    message = str(caught.value)
    assert message.startswith("stages.grpo.rewards[0]: reward function 'exact_answer' raised ValueError")
    assert "a batch of 3 completions" in message and "first prompt: 'Number or word? 7'" in message
    assert reward.__name__ == "exact_answer"  # what TRL logs it under


def test_a_reward_function_returning_the_wrong_count_is_named(tmp_path, monkeypatch) -> None:
    (tmp_path / "short_rewards.py").write_text("def one(completions, **kwargs):\n    return [1.0]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reward = guarded_function("short_rewards.one", {}, "stages.rloo.rewards[1]")
    with pytest.raises(
        RewardError, match=r"reward function 'short_rewards.one' returned 1 rewards on a batch of 2"
    ):
        reward(prompts=["a", "b"], completions=["x", "y"])


def test_shipped_rewards_on_standard_and_conversational_completions() -> None:
    chat = [[{"role": "assistant", "content": " Number. "}], [{"role": "assistant", "content": "word"}]]
    assert exact_answer(chat, answer=["number", "number"]) == [1.0, 0.0]
    assert format_match(["number.", "number", "two\nlines."]) == [1.0, 0.0, 0.0]
    assert format_match(chat, pattern=r"[a-z]+") == [0.0, 1.0]
    assert length_target(["one two three four", "one two", ""], target=4) == [1.0, 0.5, 0.0]


def test_json_fields_reads_the_object_a_reply_holds_and_compares_every_field() -> None:
    """The JSON recipe's content reward: SmolLM2 fences its object and explains it after; the fields count."""
    answer = '{"name": "Lena", "age": 63}'
    replies = [
        '{"name": "Lena", "age": 63}',
        '```json\n{\n  "age": 63,\n  "name": "Lena"\n}\n```\n\nThis JSON object {is} a JSON string',
        '{"name": "Lena", "age": 12}',  # the sentence's other number
        '{"name": "Lena", "age": 63, "city": "Lima"}',  # a field it was not asked for
        '{"name": "Lena", "age": 63',  # cut before it closes
        "Lena is 63.",
    ]
    assert json_fields(replies, answer=[answer] * 6) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert json_fields([[{"role": "assistant", "content": answer}]], answer=["no object"]) == [0.0]


def test_a_model_without_a_one_label_head_is_refused_as_reward_model(tmp_path) -> None:
    from transformers import LlamaConfig

    from align.models.loading import resolve_model
    from align.stages.rl import reward_model_problem

    causal = resolve_model("tiny")
    problem = reward_model_problem(causal)
    assert problem is not None and "is not a reward model: it has a LlamaForCausalLM head" in problem
    LlamaConfig(architectures=["LlamaForSequenceClassification"], num_labels=1).save_pretrained(tmp_path)
    assert reward_model_problem(str(tmp_path)) is None
    LlamaConfig(architectures=["LlamaForSequenceClassification"], num_labels=2).save_pretrained(tmp_path)
    assert "is not a reward model: it has 2 labels" in reward_model_problem(str(tmp_path))


def test_toy_task_holds_out_whole_items(tmp_path) -> None:
    build_toy(tmp_path)
    rows = {
        split: [json.loads(line) for line in (tmp_path / f"number-or-word-{split}.jsonl").open()]
        for split in ("train", "test")
    }
    items = {split: {row["prompt"][0]["content"] for row in found} for split, found in rows.items()}
    assert len(items["test"]) == 64 and not items["train"] & items["test"]
    for row in rows["train"] + rows["test"]:
        item = row["prompt"][0]["content"].removeprefix("Number or word? ")
        assert row["answer"] == ("number" if item.isdigit() else "word")
    sft = [json.loads(line) for line in (tmp_path / "number-or-word-sft.jsonl").open()]
    assert {row["messages"][0]["content"] for row in sft} == items["train"]


# --- the stages, run through the CLI ---


@pytest.fixture(scope="module")
def rl_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("rl")
    shipped = yaml.safe_load((ROOT / "pipelines" / "tiny_sft_rm_ppo.yaml").read_text())["stages"]
    stages = {
        "sft": shipped["sft"],
        "reward": shipped["reward"],
        "ppo": shipped["ppo"],
        "grpo": rl_stage("grpo", RULES),
        "rloo": rl_stage(
            "rloo",
            [
                *RULES,
                {"function": "length", "args": {"target": 1}},
                {"model": "${stages.reward.output}", "weight": 0.1},
            ],
        ),
    }
    path = write(folder, stages)
    run(path)
    return path


@pytest.mark.integration
def test_reward_model_ranks_held_out_pairs_and_loads_as_a_plain_classifier(rl_run) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    record = stage_record(rl_run, "reward")
    metrics = record["metrics"]
    assert metrics["pairwise_accuracy_after"] > 0.7
    assert metrics["pairwise_accuracy_after"] > metrics["pairwise_accuracy_before"]
    folder = record["output"]["path"]
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.config.num_labels == 1 and model.config.pad_token_id == tokenizer.pad_token_id
    with torch.no_grad():
        assert model(**tokenizer(["Hello there"], return_tensors="pt")).logits.shape == (1, 1)


@pytest.mark.integration
def test_grpo_raises_the_held_out_reward(rl_run) -> None:
    metrics = stage_record(rl_run, "grpo")["metrics"]
    assert metrics["reward_mean_after"] > metrics["reward_mean_before"] + 0.2
    # the format is learned without losing the answers SFT taught
    assert metrics["reward_exact_answer_before"] > 0.7
    assert metrics["reward_exact_answer_after"] > metrics["reward_exact_answer_before"] - 0.1


@pytest.mark.integration
def test_ppo_against_the_learned_reward_teaches_the_rule_with_bounded_kl(rl_run) -> None:
    metrics = stage_record(rl_run, "ppo")["metrics"]
    # the reward model's own score rises on held-out prompts ...
    assert metrics["reward_model_after"] > metrics["reward_model_before"] + 0.5
    # ... and by rule it is the format the reward model prefers, without hacking away the answers
    assert metrics["reward_format_after"] > metrics["reward_format_before"] + 0.15
    assert metrics["reward_exact_answer_after"] > 0.75  # from ~0.95; a hacked policy falls to ~0.4
    assert 0 < metrics["train_kl_last"] < 3  # the adaptive controller holds it near its 1-nat target
    assert metrics["trainable_changed"] == 1.0


@pytest.mark.integration
@pytest.mark.parametrize("stage", ["ppo", "grpo", "rloo"])
def test_rl_stages_record_where_their_time_went(rl_run, stage: str) -> None:
    metrics = stage_record(rl_run, stage)["metrics"]
    split = [metrics[f"time_{phase}_s"] for phase in ("generate", "score", "update")]
    assert all(seconds > 0 for seconds in split)  # each phase ran and was timed
    runtime = metrics["seconds_per_step"] * stage_record(rl_run, stage)["steps_trained"]
    assert sum(split) == pytest.approx(runtime, rel=0.01)  # the three phases are the whole train loop


def test_ppo_adapter_loads_with_plain_peft_and_changes_the_policy(rl_run) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_folder = stage_record(rl_run, "sft")["output"]["path"]
    adapter = stage_record(rl_run, "ppo")["output"]["path"]
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    batch = tokenizer(["Number or word? 7"], return_tensors="pt")
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(base_folder)(**batch).logits
        policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_folder), adapter)
        tuned = policy(**batch).logits
    assert policy.active_adapter == "default"  # the policy's adapter, not the critic's (in value/)
    assert (tuned - base).abs().max() > 1e-3


@pytest.mark.integration
def test_rloo_with_a_reward_model_raises_the_held_out_reward(rl_run) -> None:
    metrics = stage_record(rl_run, "rloo")["metrics"]
    assert {"reward_model_before", "reward_length_after"} <= set(metrics)
    assert metrics["reward_mean_after"] > metrics["reward_mean_before"] + 0.3
    assert metrics["reward_exact_answer_after"] > metrics["reward_exact_answer_before"] - 0.1
