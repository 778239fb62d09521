"""Load a model folder with plain `transformers` and generate a reply: proof that an output is usable."""

import argparse

from transformers import AutoModelForCausalLM, AutoTokenizer

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("model_dir")
parser.add_argument("--prompt", default="What is the capital of France?")
parser.add_argument("--max-new-tokens", type=int, default=24)
args = parser.parse_args()

tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
model = AutoModelForCausalLM.from_pretrained(args.model_dir)
messages = [{"role": "user", "content": args.prompt}]
inputs = tokenizer.apply_chat_template(
    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
)
output = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
reply = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
print(f"{type(model).__name__} from {args.model_dir}\nuser: {args.prompt}\nassistant: {reply}")
