"""The stage graph: references read from real stage models, file order kept, cycles named."""

from __future__ import annotations

import pytest

from align.config.spec import DPOStage, MergeStage, SFTStage
from align.errors import Problem
from align.pipeline.graph import downstream, order, references, upstream


def sft(model: str | None = None, train: str = "x.jsonl") -> SFTStage:
    return SFTStage(kind="sft", model=model, data={"train": train})


def dpo(model: str | None = None, train: str = "prefs.jsonl") -> DPOStage:
    return DPOStage(kind="dpo", model=model, data={"train": train}, lora={"r": 8})


def merge(model: str, **extra) -> MergeStage:
    return MergeStage(kind="merge", model=model, **extra)


def ref(name: str) -> str:
    return "${stages." + name + ".output}"


# references


def test_references_follow_model_values() -> None:
    stages = {"sft": sft(), "dpo": dpo(ref("sft")), "merge": merge(ref("dpo"))}
    assert references(stages) == ({"sft": [], "dpo": ["sft"], "merge": ["dpo"]}, [])


def test_plain_strings_are_not_references() -> None:
    stages = {"a": sft("tiny", train="align:chatterbot/sft/train"), "b": sft("./models/base")}
    assert references(stages) == ({"a": [], "b": []}, [])


def test_reference_with_surrounding_whitespace_still_counts() -> None:
    stages = {"a": sft(), "b": merge(f"  {ref('a')} ")}
    assert references(stages) == ({"a": [], "b": ["a"]}, [])


def test_references_anywhere_in_a_stage_and_deduplicated() -> None:
    stages = {"a": sft(), "b": sft(ref("a"), train=ref("a"))}
    edges, problems = references(stages)
    assert edges == {"a": [], "b": ["a"]}
    assert problems == []


def test_references_keep_the_order_they_are_found_in() -> None:
    stages = {"a": sft(), "b": sft(), "c": sft(ref("b"), train=ref("a"))}
    assert references(stages)[0]["c"] == ["b", "a"]


def test_unknown_stage_is_a_problem_naming_the_path_and_the_known_stages() -> None:
    edges, problems = references({"sft": sft(), "dpo": dpo(ref("stf"))})
    assert edges == {"sft": [], "dpo": []}
    assert problems == [Problem("stages.dpo.model", "refers to unknown stage 'stf'; stages: sft, dpo")]


@pytest.mark.parametrize(
    "value",
    [
        "${stages.sft}",
        "${stages.sft.output}/adapter",
        "prefix ${stages.sft.output}",
        "${stages.sft.outputs}",
        "${sft.output}",
    ],
)
def test_malformed_reference_is_a_problem(value: str) -> None:
    edges, problems = references({"sft": sft(), "merge": merge(value)})
    assert edges["merge"] == []
    assert len(problems) == 1
    assert problems[0].path == "stages.merge.model"
    assert problems[0].message.startswith(f"{value!r} is not a reference")
    assert "${stages.NAME.output}" in problems[0].message


def test_reference_in_a_list_names_its_index() -> None:
    stages = {"sft": sft(), "merge": merge(ref("sft"), check_prompts=["hi", "${oops}"])}
    edges, problems = references(stages)
    assert edges["merge"] == ["sft"]
    assert [p.path for p in problems] == ["stages.merge.check_prompts[1]"]


def test_reference_in_a_nested_block_names_its_full_path() -> None:
    stage = SFTStage(kind="sft", data={"train": "x.jsonl"}, trl={"hub_model_id": ref("nope")})
    _, problems = references({"sft": stage})
    assert [p.path for p in problems] == ["stages.sft.trl.hub_model_id"]


def test_a_stage_cannot_read_its_own_output() -> None:
    edges, problems = references({"sft": sft(ref("sft"))})
    assert edges == {"sft": []}
    assert problems == [Problem("stages.sft.model", "a stage cannot consume its own output")]


def test_every_bad_reference_is_reported_at_once() -> None:
    stages = {"a": sft(ref("zz")), "b": sft("${stages.a}"), "c": merge(ref("c"))}
    _, problems = references(stages)
    assert [p.path for p in problems] == ["stages.a.model", "stages.b.model", "stages.c.model"]


# order


def test_order_keeps_file_order_when_nothing_constrains_it() -> None:
    assert order({"c": [], "a": [], "b": []}) == (["c", "a", "b"], [])


def test_order_puts_dependencies_first_and_otherwise_keeps_file_order() -> None:
    edges = {"x": [], "y": ["z"], "z": [], "w": []}
    assert order(edges) == (["x", "z", "y", "w"], [])


def test_order_of_a_chain_written_backwards() -> None:
    edges = {"merge": ["dpo"], "dpo": ["sft"], "sft": []}
    assert order(edges) == (["sft", "dpo", "merge"], [])


def test_order_of_a_diamond() -> None:
    edges = {"top": ["left", "right"], "left": ["base"], "right": ["base"], "base": []}
    assert order(edges) == (["base", "left", "right", "top"], [])


def test_order_of_references_from_real_stages() -> None:
    stages = {"merge": merge(ref("dpo")), "dpo": dpo(ref("sft")), "sft": sft()}
    edges, problems = references(stages)
    assert problems == []
    assert order(edges)[0] == ["sft", "dpo", "merge"]


def test_two_stage_cycle_is_named() -> None:
    done, problems = order({"a": ["b"], "b": ["a"]})
    assert done == []
    assert problems == [Problem("stages.a", "stages form a cycle: a -> b -> a")]


def test_cycle_behind_other_stages_names_only_the_cycle() -> None:
    edges = {"free": [], "entry": ["a"], "a": ["b"], "b": ["c"], "c": ["a"], "after": ["free"]}
    done, problems = order(edges)
    assert done == ["free", "after"]
    assert len(problems) == 1
    assert problems[0].message == "stages form a cycle: a -> b -> c -> a"


def test_self_loop_is_a_cycle() -> None:
    assert order({"a": ["a"]})[1] == [Problem("stages.a", "stages form a cycle: a -> a")]


def test_cycle_from_real_stages() -> None:
    edges, problems = references({"a": sft(ref("b")), "b": sft(ref("a"))})
    assert problems == []
    assert "a -> b -> a" in order(edges)[1][0].message


# downstream / upstream

CHAIN = {"sft": [], "dpo": ["sft"], "merge": ["dpo"], "other": []}
DIAMOND = {"base": [], "left": ["base"], "right": ["base"], "top": ["left", "right"], "lone": []}


@pytest.mark.parametrize(
    ("edges", "roots", "expected"),
    [
        (CHAIN, {"sft"}, {"sft", "dpo", "merge"}),
        (CHAIN, {"dpo"}, {"dpo", "merge"}),
        (CHAIN, {"merge"}, {"merge"}),
        (CHAIN, {"other"}, {"other"}),
        (CHAIN, set(), set()),
        (DIAMOND, {"base"}, {"base", "left", "right", "top"}),
        (DIAMOND, {"left"}, {"left", "top"}),
        (DIAMOND, {"left", "lone"}, {"left", "top", "lone"}),
    ],
)
def test_downstream(edges: dict[str, list[str]], roots: set[str], expected: set[str]) -> None:
    assert downstream(edges, roots) == expected


def test_downstream_does_not_depend_on_file_order() -> None:
    backwards = {"merge": ["dpo"], "dpo": ["sft"], "sft": []}
    assert downstream(backwards, {"sft"}) == {"sft", "dpo", "merge"}


@pytest.mark.parametrize(
    ("edges", "roots", "expected"),
    [
        (CHAIN, {"merge"}, {"sft", "dpo", "merge"}),
        (CHAIN, {"dpo"}, {"sft", "dpo"}),
        (CHAIN, {"sft"}, {"sft"}),
        (CHAIN, {"merge", "other"}, {"sft", "dpo", "merge", "other"}),
        (CHAIN, set(), set()),
        (DIAMOND, {"top"}, {"base", "left", "right", "top"}),
        (DIAMOND, {"right"}, {"base", "right"}),
    ],
)
def test_upstream(edges: dict[str, list[str]], roots: set[str], expected: set[str]) -> None:
    assert upstream(edges, roots) == expected


def test_upstream_and_downstream_do_not_change_their_inputs() -> None:
    edges = {name: list(deps) for name, deps in DIAMOND.items()}
    roots = {"left"}
    upstream(edges, roots)
    downstream(edges, roots)
    assert edges == DIAMOND
    assert roots == {"left"}
