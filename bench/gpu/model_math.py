#!/usr/bin/env python3
"""Model FLOPs per token and MFU: the Python copy of common/spec/model_math.{h,cc}.

The convention (docs/ENGINE.md "MFU"): a trained token costs 6 N + 6 L h s FLOPs, N the decoder
layers' parameters plus the lm_head matmul (vocab x hidden, also when tied), L layers, h hidden
size, s sequence length (causal attention: QK^T and AV, half the square, forward and backward).
Recomputation is not counted. tests/common/spec/model_math_test.cc runs this file and checks
its figures against the C++ ones:

  python3 -S bench/gpu/model_math.py '[[{"vocab_size": 128256, "hidden_size": 2048, ...}, 32768]]'
prints the FLOPs per token of each case (repr of a float), one a line. Standard library only.
"""
import json
import sys


def layer_parameters(shape):
    """One decoder layer: q, k, v, o projections; gate, up, down; two RMSNorm weights."""
    h = shape["hidden_size"]
    hq = shape["num_attention_heads"]
    hkv = shape.get("num_key_value_heads") or hq
    d = h // hq  # The engine's head_dim rule (hidden_size / num_attention_heads).
    inter = shape["intermediate_size"]
    return h * hq * d + 2 * h * hkv * d + hq * d * h + 3 * h * inter + 2 * h


def model_flops_per_token(shape, seq_len):
    h, layers = shape["hidden_size"], shape["num_hidden_layers"]
    lm_head = shape["vocab_size"] * h
    return float(6 * (layers * layer_parameters(shape) + lm_head) + 6 * layers * h * seq_len)


def mfu(flops_per_token, tokens_per_s, devices, peak_flops_per_s):
    """None when a figure is unknown (not positive), as spec::Mfu's nullopt."""
    if not (flops_per_token > 0 and peak_flops_per_s > 0 and devices >= 1 and tokens_per_s >= 0):
        return None
    return flops_per_token * tokens_per_s / (devices * peak_flops_per_s)


if __name__ == "__main__":
    # CASES_JSON: [[SHAPE, SEQ_LEN], ...]; one FLOPs-per-token figure (repr of a float) a line.
    if len(sys.argv) != 2:
        sys.exit("usage: model_math.py '[[SHAPE_JSON_OBJECT, SEQ_LEN], ...]'")
    for shape, seq_len in json.loads(sys.argv[1]):
        print(repr(model_flops_per_token(shape, int(seq_len))))
