#!/usr/bin/env python3
"""Where a profiled training step's GPU time goes: sums the kernel time of a Kineto/Chrome trace
(engine_bench --profile-trace) by category and lists the top kernels.

  python3 bench/gpu/trace_summary.py TRACE.json [--top 15]   -> JSON on stdout
"""
import argparse
import collections
import json
import sys

# First matching substring (lower case) names a kernel's category.
CATEGORIES = [
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn_generated_fort_native_sdpa")),
    ("matmul", ("gemm", "xmma", "cutlass", "cublas", "nvjet", "sm90_", "sm80_")),
    ("memcpy/memset", ("memcpy", "memset")),
    ("softmax/loss", ("softmax", "log_softmax", "nll_loss", "cross_entropy", "logsumexp")),
    ("reduction", ("reduce", "norm")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "pointwise", "copy", "fill",
                     "cat", "index", "gather", "scatter", "where")),
    ("optimizer", ("adam", "foreach", "multi_tensor")),
]


def category(name):
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args()
    with open(a.trace) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels = [e for e in events if e.get("ph") == "X" and
               str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        print(json.dumps({"error": "no GPU kernels in the trace"}))
        return 1
    start = min(e["ts"] for e in kernels)
    end = max(e["ts"] + e.get("dur", 0) for e in kernels)
    by_cat = collections.Counter()
    by_name = collections.Counter()
    for e in kernels:
        by_cat[category(e["name"])] += e.get("dur", 0)
        by_name[e["name"][:120]] += e.get("dur", 0)
    busy = sum(by_cat.values())
    out = {
        "gpu_span_ms": (end - start) / 1e3,
        "kernel_ms": busy / 1e3,
        "idle_fraction": 1 - busy / max(end - start, 1),
        "kernels": len(kernels),
        "by_category_ms": {k: v / 1e3 for k, v in by_cat.most_common()},
        "by_category_share": {k: v / busy for k, v in by_cat.most_common()},
        "top_kernels_ms": [[n, v / 1e3] for n, v in by_name.most_common(a.top)],
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
