"""Tool-calling rows (OpenAI `messages` with `tool_calls`, `tool` turns, a `tools` column as a JSON string):
`align validate` renders them through the stage's chat template and refuses one that leaves a part out,
naming the row, the field, the template and the way out; under the builtin `chatml-tools` they validate,
train, and keep every turn, with the tool results masked from the loss as user turns are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from align.cli import main
from align.models.chat_templates import BUILTIN
from align.planning.hardware import Hardware
from tests.pipelines import run_in_process

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)
CITIES = ["Paris", "Lyon", "Oslo", "Lima", "Rome", "Kyiv"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather now in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'


def tool_row(index: int, content: str | None = "") -> dict:
    """One OpenAI-style row: the assistant calls a tool (its `arguments` a JSON string), reads the result,
    answers."""
    city, degrees = CITIES[index % len(CITIES)], 10 + index % 15
    call = {"name": "get_weather", "arguments": json.dumps({"city": city})}
    return {
        "messages": [
            {"role": "system", "content": "You answer weather questions."},
            {"role": "user", "content": f"What is the weather in {city}?"},
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [{"id": f"c{index}", "type": "function", "function": call}],
            },
            {"role": "tool", "tool_call_id": f"c{index}", "content": json.dumps({"temp_c": degrees})},
            {"role": "assistant", "content": f"It is {degrees} degrees in {city}."},
        ],
        "tools": json.dumps(TOOLS),
    }


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def pipeline(folder: Path, data: str, template: str | None = None, **trl: object) -> Path:
    body = {
        "name": "tools",
        "base_model": "tiny",
        **({"chat_template": template} if template else {}),
        "defaults": {"output_root": str(folder / "runs"), "precision": "fp32", "seed": 0, "backend": "ddp"},
        "stages": {
            "sft": {
                "kind": "sft",
                "data": {"train": data, "eval": "none"},
                "trl": {
                    "max_steps": 2,
                    "per_device_train_batch_size": 4,
                    "max_length": 512,
                    "report_to": "none",
                    "save_strategy": "no",
                    "logging_steps": 1,
                    "assistant_only_loss": True,
                    **trl,
                },
            }
        },
    }
    path = folder / "tools.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def validate(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str]:
    code = main(["validate", str(path)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_the_tiny_models_own_chatml_drops_the_tool_call_and_validate_says_where(
    capsys, tmp_path: Path
) -> None:
    data = write_rows(tmp_path / "tools.jsonl", [tool_row(index) for index in range(120)])
    code, said = validate(capsys, pipeline(tmp_path, str(data)))
    assert code == 2, said
    assert (
        "stages.sft.data.train" in said and f"{data}: of 33 rows rendered by tiny's own chat template" in said
    )
    assert "33 leave parts out: line 1 loses tools[0].function.name ('get_weather'), " in said
    assert "messages[2].tool_calls[0].function.name ('get_weather')" in said
    assert """messages[2].tool_calls[0].function.arguments ('{"city": "Paris"}')""" in said
    assert "set `chat_template: chatml-tools`" in said

    code, said = validate(capsys, pipeline(tmp_path, str(data), "chatml-tools"))
    assert code == 0, said


def test_a_turn_with_no_text_beside_its_call_is_named_where_the_template_fails(
    capsys, tmp_path: Path
) -> None:
    """OpenAI's `content: null` beside `tool_calls`: the scan takes it, the tiny template cannot render it."""
    data = write_rows(tmp_path / "tools.jsonl", [tool_row(index, content=None) for index in range(8)])
    code, said = validate(capsys, pipeline(tmp_path, str(data)))
    assert (
        code == 2 and "8 do not render: line 1 cannot be rendered from messages[2] on (UndefinedError" in said
    )
    assert "set `chat_template: chatml-tools`" in said
    assert validate(capsys, pipeline(tmp_path, str(data), "chatml-tools"))[0] == 0


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (  # a system turn dropped
            "{% for m in messages if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}"
            "<|im_end|>\n{% endfor %}",
            "messages[0].content ('You answer weather questions.')",
        ),
        (  # tool results dropped: the calls and schemas are there, the turns' text is not
            BUILTIN["chatml-tools"].text.replace(
                "{{ text(message.content) }}{{ '\\n</tool_response>' }}", "{{ '\\n</tool_response>' }}"
            ),
            """line 2 loses messages[3].content ('{"temp_c": 11}')""",
        ),
        (  # a template that refuses a role
            "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool turns here') }}"
            "{% endif %}{{ m.content }}{% endfor %}",
            "line 2 cannot be rendered from messages[3] on (TemplateError: no tool turns here)",
        ),
    ],
)
def test_a_template_that_drops_a_turn_or_refuses_one_is_refused(capsys, tmp_path, template, expected) -> None:
    (tmp_path / "mine.jinja").write_text(template)
    rows = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}]
    data = write_rows(
        tmp_path / "rows.jsonl", rows + [tool_row(1)]
    )  # line 2 holds the only system and tool turns
    code, said = validate(capsys, pipeline(tmp_path, str(data), str(tmp_path / "mine.jinja")))
    assert code == 2 and expected in said, said
    assert f"the chat template {tmp_path / 'mine.jinja'}" in said


def test_bad_tool_calls_and_tools_are_refused_by_the_scan(capsys, tmp_path: Path) -> None:
    nameless, broken = tool_row(0), tool_row(1)
    nameless["messages"][2]["tool_calls"][0]["function"].pop("name")
    broken["tools"] = "[{not json"
    data = write_rows(tmp_path / "tools.jsonl", [tool_row(2), nameless, broken])
    code, said = validate(capsys, pipeline(tmp_path, str(data), "chatml-tools"))
    assert code == 2
    assert "1 of 3 rows has a tool call with no function name: line 2" in said, said
    assert "1 of 3 rows has a 'tools' that is not a list of function schemas: line 3" in said, said


def test_chatml_tools_writes_each_call_form_and_masks_tool_results(tmp_path: Path) -> None:
    """String and dict arguments, nested and flat calls; assistant turns (calls included) carry the
    generation markers, tool turns do not."""
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [
        {"role": "user", "content": "Weather in Oslo and Lima?"},
        {
            "role": "assistant",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
                {"name": "get_weather", "arguments": {"city": "Lima"}},
            ],
        },
        {"role": "tool", "content": "4"},
        {"role": "tool", "content": "19"},
        {"role": "assistant", "content": "Oslo 4, Lima 19."},
    ]
    (text,), (spans,) = render_jinja_template(
        [messages], tools=TOOLS, chat_template=BUILTIN["chatml-tools"].text, return_assistant_tokens_mask=True
    )
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    trained = [text[start:end] for start, end in spans]
    assert trained == [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call><|im_end|>',
        "Oslo 4, Lima 19.<|im_end|>",
    ]
    assert (
        "<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\n19\n</tool_response><|im_end|>"
        in text
    )


@pytest.mark.integration
def test_under_chatml_tools_a_stage_trains_on_every_turn_and_not_on_tool_results(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    rows = [tool_row(index) for index in range(8)]  # 2 steps of 4: every row trains
    data = write_rows(tmp_path / "tools.jsonl", rows)
    run_in_process(pipeline(tmp_path, str(data), "chatml-tools"), "sft", tmp_path / "out", CPU)
    losses = [
        json.loads(line) for line in (tmp_path / "out" / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    assert len([entry for entry in losses if "loss" in entry]) == 2

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out" / "model")
    assert tokenizer.chat_template == BUILTIN["chatml-tools"].text
    row = rows[0]  # rendered as TRL's SFT renders it: the row's tools parsed from their JSON string
    rendered = tokenizer.apply_chat_template(row["messages"], tools=json.loads(row["tools"]), tokenize=False)
    assert (
        CALL in rendered and '"name": "get_weather", "description": "The weather now in a city"' in rendered
    )

    tokens = tokenizer.apply_chat_template(
        row["messages"], tools=json.loads(row["tools"]), return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = tokens["input_ids"], tokens["assistant_masks"]
    trained = tokenizer.decode([token for token, keep in zip(ids, mask, strict=True) if keep])
    masked = tokenizer.decode([token for token, keep in zip(ids, mask, strict=True) if not keep])
    assert trained == CALL + "It is 10 degrees in Paris.<|im_end|>"
    assert (
        '<tool_response>\n{"temp_c": 10}\n</tool_response>' in masked
        and "What is the weather in Paris?" in masked
    )


@pytest.mark.parametrize("renames", [{}, {"conversation": "messages"}])
def test_tools_reach_trl_as_written_in_either_form(tmp_path: Path, renames: dict[str, str]) -> None:
    """A file's `tools` lists of schemas that differ load as written, renamed or not; JSON strings stay
    strings (TRL's trainers parse them). Parsing them into lists in a `map` would not do: Arrow then gives
    every schema the union of their properties, the missing ones null."""
    from align.data.loading import load_data

    search = {"type": "function", "function": {"name": "search", "parameters": {"properties": {"q": {}}}}}
    key = next(iter(renames), "messages")
    for tools in ([[*TOOLS, search], [search], TOOLS], [json.dumps(TOOLS), json.dumps([search])]):
        rows = [{key: tool_row(index)["messages"], "tools": listed} for index, listed in enumerate(tools)]
        data = write_rows(tmp_path / "tools.jsonl", rows)
        loaded = load_data(str(data), "sft", "stages.sft.data.train", renames)
        assert [row["tools"] for row in loaded] == tools
        assert loaded[0]["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
