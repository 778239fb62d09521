"""An eval stage's own blocks: how it asks each model (`generation:`), its prompts (`data:`), and the
lm-evaluation-harness tasks it runs (`lm_eval:`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from align.config.strict import Strict


class GenerationSpec(Strict):
    """How an eval stage asks each model: greedy (temperature 0, the default) or sampled."""

    max_new_tokens: Annotated[int, Field(gt=0)] = 64
    temperature: Annotated[float, Field(ge=0)] = 0.0  # 0: greedy
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    num_samples: Annotated[int, Field(gt=0)] = 1  # completions per prompt and model (sampled only)
    seed: int | None = None  # default: the pipeline's seed

    @model_validator(mode="after")
    def samples_differ(self) -> GenerationSpec:
        if self.num_samples > 1 and self.temperature == 0:
            raise ValueError("greedy decoding (temperature 0) gives one answer: set temperature or 1 sample")
        return self


class EvalDataSpec(Strict):
    """An eval stage's prompts: a `prompt` column (text or a conversation), plus any column its rewards read
    (`answer` for exact_answer)."""

    prompts: str
    max_rows: Annotated[int, Field(gt=0)] | None = None
    columns: dict[str, str] = {}  # renames, as `data.columns` of a training stage


class LmEvalSpec(Strict):
    """lm-evaluation-harness tasks run on each model: task names, a folder of the user's task YAMLs, and at
    most `limit` documents per task."""

    tasks: Annotated[list[str], Field(min_length=1)]
    include_path: str | None = None
    limit: Annotated[int, Field(gt=0)] | None = None
    num_fewshot: Annotated[int, Field(ge=0)] | None = None
    apply_chat_template: bool = True  # when the model's tokenizer has one
