"""YAML that does not parse, or parses into something that is not a pipeline: each named by its line."""

from tests.bad_inputs import Case

HEADER = "name: bad\nbase_model: tiny\n"
SFT = "  sft:\n    kind: sft\n    data: {train: align:chatterbot/sft/train}\n"
NOT_A_MAPPING = "the file must be a YAML mapping with name, base_model and stages"

CASES = [
    Case(
        "yaml-tab-indent",
        pipeline=HEADER + "stages:\n\tsft: {kind: sft}\n",
        expect=("line 4", "invalid YAML"),
    ),
    Case(
        "yaml-unclosed-flow",
        pipeline=HEADER + "stages:\n  sft:\n    kind: sft\n    data: {train: x.jsonl\n",
        expect=("line 7", "invalid YAML"),
    ),
    Case(
        "yaml-unclosed-quote",
        pipeline=HEADER + 'stages:\n  sft:\n    kind: "sft\n',
        expect=("invalid YAML", "found unexpected end of stream"),
    ),
    Case(
        "yaml-value-after-key-value", pipeline="name: a: b\n", expect=("line 1, column 8", "mapping values")
    ),
    Case(
        "yaml-repeated-stage",
        pipeline=HEADER + "stages:\n" + SFT + SFT,
        expect=("line 7, column 3", "the key 'sft' appears twice in one mapping"),
    ),
    Case(
        "yaml-repeated-trl-key",
        pipeline=HEADER + "stages:\n" + SFT + "    trl: {max_steps: 1, max_steps: 2}\n",
        expect=("line 7, column 25", "the key 'max_steps' appears twice"),
    ),
    Case(
        "yaml-recursive-alias",
        pipeline=HEADER + "stages: &all\n  sft: *all\n",
        expect=("line 4, column 8", "the alias *all is inside the value &all names"),
    ),
    Case(
        "yaml-recursive-alias-in-list",
        pipeline=HEADER + "stages:\n" + SFT + "    rewards: &r [*r]\n",
        expect=("line 7, column 18", "would contain itself"),
    ),
    Case(
        "yaml-merge-key",
        pipeline=HEADER
        + "common: &common\n  kind: sft\nstages:\n  sft:\n    <<: *common\n"
        + SFT.splitlines()[2],
        expect=("line 7, column 5", "merge keys (`<<: *name`) are not read"),
    ),
    Case(
        "yaml-undefined-alias",
        pipeline=HEADER + "stages:\n  sft: *nowhere\n",
        expect=("line 4", "found undefined alias 'nowhere'"),
    ),
    Case(
        "yaml-python-tag",
        pipeline=HEADER + "stages: !!python/object:os.system {}\n",
        expect=("line 3", "could not determine a constructor"),
    ),
    Case(
        "yaml-two-documents",
        pipeline=HEADER + "stages:\n" + SFT + "---\n" + HEADER,
        expect=("line 7", "expected a single document in the stream, but found another document"),
    ),
    Case("yaml-empty-file", pipeline="", expect=(NOT_A_MAPPING,)),
    Case("yaml-only-comments", pipeline="# a pipeline, some day\n", expect=(NOT_A_MAPPING,)),
    Case("yaml-a-list", pipeline="- name: bad\n- base_model: tiny\n", expect=(NOT_A_MAPPING,)),
    Case("yaml-a-scalar", pipeline="just some words\n", expect=(NOT_A_MAPPING,)),
]
