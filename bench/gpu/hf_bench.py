#!/usr/bin/env python3
"""Hugging Face transformers baseline for bench/gpu/engine_bench.cc, on the same GPU.

LlamaForCausalLM at the Llama-3.2-1B (or --shape llama3.1-8b) shape (random init), bf16
parameters, attn_implementation "sdpa", gradient checkpointing, fused AdamW; one sequence per
step, random token ids. Prints one
JSON object per line in engine_bench's format ({"kind": "step" | "fit" | "max_seq", ...}).

  python3 bench/gpu/hf_bench.py --seq 8192,32768,131072 [--steps 3] [--warmup 1] \
      [--max-seq 8192 --max-seq-limit 1048576 --max-seq-step-budget 120]

MFU uses the one convention of common/spec/model_math.h (its Python copy bench/gpu/model_math.py,
tested against it): tokens x (6 N + 6 L d s) / (seconds x 989e12), N the layers' parameters plus
the lm_head matmul.
"""
import argparse
import gc
import json
import os
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_math  # noqa: E402  (bench/gpu/model_math.py)

# The spec presets llama3-1b and llama3-8b (common/spec/model_shape.cc; engine_bench --shape takes
# these names too), as a literal: tests/common/spec/model_math_test.cc checks them against the
# presets without importing this file.
SHAPES = {
    "llama3.2-1b": {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
                    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                    "rope_theta": 500000.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
                    "head_dim": 64},
    "llama3.1-8b": {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
                    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                    "rope_theta": 500000.0, "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
                    "head_dim": 128},
}
SHAPE_NAME = "llama3.2-1b"
SHAPE = SHAPES[SHAPE_NAME]  # main() selects --shape before building the model.


def step_flops(s):
    return s * model_math.model_flops_per_token(SHAPE, s)


class Bench:
    def __init__(self, max_positions, peak_tflops):
        self.peak = peak_tflops * 1e12
        config = LlamaConfig(max_position_embeddings=max_positions, use_cache=False, **SHAPE)
        config._attn_implementation = "sdpa"
        with torch.device("cuda"):
            self.model = LlamaForCausalLM(config).to(torch.bfloat16)
        self.model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5, fused=True)

    def step(self, s):
        """Seconds for one optimizer step at length s, or None when it ran out of memory."""
        ids = torch.randint(SHAPE["vocab_size"], (1, s), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            out = self.model(input_ids=ids, labels=ids)
            out.loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            return time.perf_counter() - t0
        except torch.OutOfMemoryError:
            out = None
            self.opt.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
            return None

    def common(self, s):
        return {"seq_len": s, "shape": SHAPE_NAME, "dtype": "bfloat16", "framework":
                f"transformers {transformers.__version__}", "torch": torch.__version__,
                "gradient_checkpointing": True, "attn_implementation": "sdpa"}

    def measure(self, s, warmup, steps):
        torch.cuda.reset_peak_memory_stats()
        for _ in range(warmup):
            if self.step(s) is None:
                return dict(self.common(s), kind="step", fits=False)
        total = 0.0
        for _ in range(steps):
            t = self.step(s)
            if t is None:
                return dict(self.common(s), kind="step", fits=False)
            total += t
        secs = total / steps
        return dict(self.common(s), kind="step", fits=True, step_seconds=secs,
                    tokens_per_s=s / secs, tflops=step_flops(s) / secs / 1e12,
                    mfu=model_math.mfu(step_flops(s) / s, s / secs, 1, self.peak),
                    peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                    peak_reserved_bytes=torch.cuda.max_memory_reserved())

    def trial(self, s):
        torch.cuda.reset_peak_memory_stats()
        t = self.step(s)
        rec = dict(self.common(s), kind="fit", fits=t is not None)
        if t is not None:
            rec.update(step_seconds=t, peak_allocated_bytes=torch.cuda.max_memory_allocated())
        print(json.dumps(rec), flush=True)
        return t

    def max_seq(self, start, limit, budget):
        good, bad, s, budget_stop = 0, 0, start, False
        while s <= limit:
            t = self.trial(s)
            if t is None:
                bad = s
                break
            good = s
            if t * 4 > budget:
                budget_stop = True
                break
            s *= 2
        while bad and good and bad - good > max(1024, good // 16):
            mid = (good + bad) // 2 // 1024 * 1024
            if mid <= good:
                break
            if self.trial(mid) is None:
                bad = mid
            else:
                good = mid
        return dict(self.common(good), kind="max_seq", max_seq_len=good, first_oom_seq_len=bad,
                    stopped_by_time_budget=budget_stop)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq", default="")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--max-seq", type=int, default=0)
    p.add_argument("--max-seq-limit", type=int, default=1 << 20)
    p.add_argument("--max-seq-step-budget", type=float, default=120)
    p.add_argument("--peak-tflops", type=float, default=989)
    p.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    a = p.parse_args()
    global SHAPE, SHAPE_NAME
    SHAPE_NAME, SHAPE = a.shape, SHAPES[a.shape]
    seqs = [int(x) for x in a.seq.split(",") if x]
    bench = Bench(max(seqs + [a.max_seq_limit]), a.peak_tflops)
    for s in seqs:
        print(json.dumps(bench.measure(s, a.warmup, a.steps)), flush=True)
    if a.max_seq:
        print(json.dumps(bench.max_seq(a.max_seq, a.max_seq_limit, a.max_seq_step_budget)),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
