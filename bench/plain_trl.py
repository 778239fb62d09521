"""The baseline of `make bench-real`: one SFT, DPO or GRPO run as a plain TRL script a user would write, with
the `trl:` settings and LoRA of the benchmark's align stage (bench/real.py passes both as JSON). Prints one
JSON line: the wall time of each phase, TRL's `train_runtime`, the steps and each step's wall time."""

import argparse
import json
import time

started = time.perf_counter()

from datasets import load_dataset  # noqa: E402 - the imports are part of the script's wall time
from peft import LoraConfig  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer  # noqa: E402

from align.rewards import final_number  # noqa: E402 - the same reward the align stage names

TRAINERS = {"sft": (SFTConfig, SFTTrainer), "dpo": (DPOConfig, DPOTrainer), "grpo": (GRPOConfig, GRPOTrainer)}


class StepEnds(TrainerCallback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=sorted(TRAINERS))
    parser.add_argument("model_dir")
    parser.add_argument("data_file")
    parser.add_argument("output_dir")
    parser.add_argument("--trl", required=True, help="the stage's trl: block, as JSON")
    parser.add_argument("--lora", required=True, help="r, alpha, target_modules, as JSON")
    args = parser.parse_args()
    config_class, trainer_class = TRAINERS[args.kind]
    lora = json.loads(args.lora)
    imported = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    if args.kind == "dpo":
        tokenizer.padding_side = "left"  # TRL's DPO pads prompts on the left
    model = AutoModelForCausalLM.from_pretrained(args.model_dir)
    rows = load_dataset("json", data_files=args.data_file, split="train")
    loaded = time.perf_counter()
    config = config_class(
        output_dir=args.output_dir, report_to=[], bf16=False, seed=0, **json.loads(args.trl)
    )
    extra = {"reward_funcs": [final_number]} if args.kind == "grpo" else {}
    clock = StepEnds()
    trainer = trainer_class(
        model=model,
        args=config,
        train_dataset=rows,
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=lora["r"],
            lora_alpha=lora["alpha"],
            target_modules=lora["target_modules"],
            task_type="CAUSAL_LM",
        ),
        callbacks=[clock],
        **extra,
    )
    built = time.perf_counter()
    result = trainer.train()
    trained = time.perf_counter()
    trainer.save_model(args.output_dir)
    saved = time.perf_counter()
    print(
        json.dumps(
            {
                "imports": imported - started,
                "load": loaded - imported,
                "prepare": built - loaded,
                "train": trained - built,
                "save": saved - trained,
                "train_runtime": result.metrics["train_runtime"],
                "steps": result.global_step,
                "step_seconds": [b - a for a, b in zip(clock.ends, clock.ends[1:], strict=False)],
            }
        )
    )


if __name__ == "__main__":
    main()
