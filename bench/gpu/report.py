#!/usr/bin/env python3
"""Markdown tables from scripts/gpu/run_checks.sh's results.jsonl (engine vs transformers; then
the `levers` step's engine runs against the engine's throughput run, and loss_bench's lines).

  python3 bench/gpu/report.py results.jsonl
"""
import json
import sys


def gib(b):
    return f"{b / 2**30:.1f}" if b else "-"


def main():
    recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    steps = {}
    for r in recs:
        if r.get("kind") == "step":
            steps.setdefault(r["seq_len"], {})[r["bench"]] = r
    print("| seq | engine tok/s | engine MFU | engine peak GiB | HF tok/s | HF MFU | HF peak GiB "
          "| engine/HF |")
    print("|---|---|---|---|---|---|---|---|")
    for s in sorted(steps):
        e, h = steps[s].get("engine", {}), steps[s].get("hf", {})

        def cell(r, k, fmt):
            if not r:
                return "-"
            if not r.get("fits"):
                return "OOM"
            return fmt(r[k])

        ratio = "-"
        if e.get("fits") and h.get("fits"):
            ratio = f"{e['tokens_per_s'] / h['tokens_per_s']:.2f}x"
        print(f"| {s} | {cell(e, 'tokens_per_s', lambda v: f'{v:,.0f}')} "
              f"| {cell(e, 'mfu', lambda v: f'{100 * v:.1f}%')} "
              f"| {cell(e, 'peak_allocated_bytes', gib)} "
              f"| {cell(h, 'tokens_per_s', lambda v: f'{v:,.0f}')} "
              f"| {cell(h, 'mfu', lambda v: f'{100 * v:.1f}%')} "
              f"| {cell(h, 'peak_allocated_bytes', gib)} | {ratio} |")
    levers = [r for r in recs if r.get("bench") == "engine-lever" and r.get("kind") == "step"]
    if levers:
        print()
        print("| seq | lever flags | tok/s | vs engine | MFU | peak GiB | attention forwards/step |")
        print("|---|---|---|---|---|---|---|")
    for r in levers:
        flags = " ".join(f for f, k in (("--keep-attention", "keep_attention_outputs"),
                                        ("--tiled-loss", "tiled_loss")) if r.get(k))
        base = steps.get(r["seq_len"], {}).get("engine", {})
        if not r.get("fits"):
            print(f"| {r['seq_len']} | {flags} | OOM | - | - | - | - |")
            continue
        vs = (f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base.get("fits") else "-")
        print(f"| {r['seq_len']} | {flags} | {r['tokens_per_s']:,.0f} | {vs} "
              f"| {100 * r['mfu']:.1f}% | {gib(r['peak_allocated_bytes'])} "
              f"| {r.get('attention_forwards_per_step', '-')} |")
    for r in recs:
        if r.get("bench") == "loss":
            print(f"loss_bench {r['variant']}: {r['seconds'] * 1e3:.1f} ms, "
                  f"peak {gib(r['peak_allocated_bytes'])} GiB ({r['tokens']} x {r['hidden']} "
                  f"against {r['vocab']}, tile {r['tile']})")
    for r in recs:
        if r.get("kind") == "max_seq":
            print(f"max_seq {r['bench']}: {r['max_seq_len']} (first OOM {r['first_oom_seq_len']}, "
                  f"stopped by time budget: {r['stopped_by_time_budget']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
