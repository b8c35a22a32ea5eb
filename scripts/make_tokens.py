#!/usr/bin/python3
"""Writes a flat little-endian uint32 token file (the format of spec.data.train/validation).

  make_tokens.py --out data/train.bin --tokens 100000 --vocab 256 [--seed 1]
      uniform random tokens in [0, vocab)
  make_tokens.py --out data/train.bin --from-text README.md [--vocab 256]
      byte-level tokens of a text file (every byte is a token; needs vocab >= 256)
  make_tokens.py --out data/train.bin --tokens 100000 --vocab 256 --markov 0.9
      a learnable stream: with probability p the next token is (prev * 7 + 3) % vocab

Needs only numpy (Debian: /usr/bin/python3).
"""
import argparse
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=0, help="number of tokens (random/markov)")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--from-text", default="", help="byte-level tokens of this file")
    ap.add_argument("--markov", type=float, default=0.0, help="deterministic-successor prob")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    if args.from_text:
        if args.vocab < 256:
            sys.exit("--from-text needs --vocab >= 256 (byte-level tokens)")
        tokens = np.frombuffer(open(args.from_text, "rb").read(), dtype=np.uint8).astype("<u4")
    else:
        if args.tokens < 2 or args.vocab < 1:
            sys.exit("--tokens must be >= 2 and --vocab >= 1")
        tokens = rng.integers(0, args.vocab, size=args.tokens, dtype=np.int64)
        if args.markov > 0:
            follow = rng.random(args.tokens) < args.markov
            for i in range(1, args.tokens):
                if follow[i]:
                    tokens[i] = (tokens[i - 1] * 7 + 3) % args.vocab
        tokens = tokens.astype("<u4")
    tokens.tofile(args.out)
    print(f"wrote {tokens.shape[0]} tokens to {args.out}")


if __name__ == "__main__":
    main()
