"""The baseline of `make bench-overhead`: the same SFT as the benchmark's align stage, as a plain TRL script
a user would write (model and data from align's cache so both read the same files). Prints one JSON line:
the train loop's seconds (TRL's `train_runtime`), the steps it ran and the real tokens it trained."""

import argparse
import json

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("model_dir")
parser.add_argument("data_file")
parser.add_argument("output_dir")
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--batch", type=int, required=True)
parser.add_argument("--max-length", type=int, required=True)
parser.add_argument("--bf16", action="store_true", help="TRL's own default on a GPU (mixed precision)")
args = parser.parse_args()

config = SFTConfig(
    output_dir=args.output_dir,
    max_steps=args.steps,
    per_device_train_batch_size=args.batch,
    max_length=args.max_length,
    learning_rate=1e-3,
    logging_steps=10,
    save_strategy="no",
    report_to=[],
    bf16=args.bf16,  # on a CPU fp32, as align's `precision: auto` runs there (bf16 is 2.8x slower there)
    seed=0,
)
trainer = SFTTrainer(
    model=AutoModelForCausalLM.from_pretrained(args.model_dir),
    args=config,
    train_dataset=load_dataset("json", data_files=args.data_file, split="train"),
    processing_class=AutoTokenizer.from_pretrained(args.model_dir),
)
result = trainer.train()
trainer.save_model(args.output_dir)
tokens = max(entry.get("num_tokens", 0) for entry in trainer.state.log_history)
print(
    json.dumps(
        {"train_seconds": result.metrics["train_runtime"], "steps": result.global_step, "tokens": tokens}
    )
)
