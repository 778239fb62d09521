"""Write the tiny random-init Llama (and its tokenizer) that tests and demos train, with no hub."""

from __future__ import annotations

import argparse
from pathlib import Path

from align.models.tiny import build_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", type=Path, help="folder to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="init seed; the same seed gives the same files")
    args = parser.parse_args()
    build_tiny_model(args.out_dir, seed=args.seed)
    print(f"wrote {args.out_dir}")


if __name__ == "__main__":
    main()
