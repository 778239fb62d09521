"""`align chat`: talk to a model, or a stage's output, its replies streamed."""

from __future__ import annotations

import argparse
import sys


def cmd_chat(args: argparse.Namespace) -> int:
    """Stream the model's replies; `--prompt` answers once and exits, else a conversation until EOF."""
    from align.report.chat import chat_target, load_chat_model, reply

    target = chat_target(args.target, args.stage, args.set)
    model, tokenizer = load_chat_model(target)
    messages = [{"role": "system", "content": args.system}] if args.system else []

    def answer(text: str) -> None:
        messages.append({"role": "user", "content": text})
        said = ""
        for piece in reply(model, tokenizer, messages, args.max_new_tokens, args.temperature):
            print(piece, end="", flush=True)
            said += piece
        print()
        messages.append({"role": "assistant", "content": said})

    if args.prompt is not None:
        answer(args.prompt)
        return 0
    print(f"chatting with {target.said} ({target.base}); Ctrl-D ends", file=sys.stderr)
    while True:
        try:
            text = input("you> ")
        except EOFError:
            print()
            return 0
        if text.strip():
            answer(text)


def add_chat(commands) -> None:
    chat = commands.add_parser("chat", help="talk to a model, or a stage's output, streaming its replies")
    chat.add_argument("target", help="a model folder (or builtin, hub id), or a pipeline YAML file")
    chat.add_argument("--stage", help="with a pipeline file: the stage whose output to load (default: last)")
    chat.add_argument("--prompt", help="answer this once and exit (for scripts)")
    chat.add_argument("--system", help="a system message before the conversation")
    chat.add_argument("--max-new-tokens", type=int, default=256, help="the longest reply, in tokens")
    chat.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default)")
    chat.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for `align run`")
    chat.set_defaults(handler=cmd_chat)
