#!/usr/bin/python3
"""Independent pure-PyTorch Llama reference (no transformers), for checking the engine.

Reads a Hugging Face Llama directory (config.json + *.safetensors, parsed here) and a
flat little-endian uint32 token file, and prints one JSON line
    {"loss": <mean next-token loss>, "tokens": <scored targets>, "windows": <n>}
over consecutive windows of T tokens, with the validation dataset's semantics:
window k covers tokens [k*T, k*T + T + 1) for k < n // T (a partial last window is
dropped); when the last window's final target lies past the end of the file it is
not scored. Positions restart at 0 in every window.

Math (as in HF's LlamaForCausalLM): RMSNorm x * rsqrt(mean(x^2) + eps) * w; RoPE
with inv_freq = theta^(-2i/D), cos/sin over cat(freqs, freqs) and rotate_half(x) =
cat(-x[D/2:], x[:D/2]); rope_scaling of type llama3 (Llama 3.1) rescales each
inverse frequency f by its wavelength w = 2 pi / f against the original context
C = original_max_position_embeddings: w < C / high_freq_factor keeps f (high
frequencies), w > C / low_freq_factor gives f / factor (low frequencies), and in
between the two are mixed with weight s = (C / w - low_freq_factor) /
(high_freq_factor - low_freq_factor): (1 - s) * f / factor + s * f; no other
rope_scaling type is accepted; GQA by repeating each kv head Hq/Hkv times (head j uses kv
head j // (Hq/Hkv)); causal softmax attention scaled by 1/sqrt(D); SwiGLU MLP
down(silu(gate(x)) * up(x)); final norm; lm_head (or the tied embedding).

Run with Debian's python: /usr/bin/python3 scripts/reference_llama.py --hf DIR
--tokens FILE --seq-len T [--max-windows N] [--dtype float64|float32]
"""
import argparse
import glob
import json
import math
import os
import struct
import sys

import numpy as np
import torch

_NP_TYPES = {
    "F32": np.float32, "F64": np.float64, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
}


def read_safetensors(path):
    """Returns {name: float64-or-int torch tensor} from one safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len].decode("utf-8"))
    base = 8 + header_len
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = data[base + begin:base + end]
        shape = entry["shape"]
        dtype = entry["dtype"]
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif dtype in _NP_TYPES:
            arr = np.frombuffer(raw, dtype=np.dtype(_NP_TYPES[dtype]).newbyteorder("<"))
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name}: shape {shape} does not match its bytes")
        out[name] = torch.from_numpy(arr.astype(np.float64).reshape(shape))
    return out


def load_weights(hf_dir):
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(hf_dir, x) for x in files]
    else:
        files = sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {hf_dir}")
    weights = {}
    for path in files:
        weights.update(read_safetensors(path))
    return weights


def rope_inverse_frequencies(theta, d, rope_scaling):
    """The d/2 RoPE inverse frequencies (python floats), scaled per rope_scaling."""
    plain = [theta ** (-(2.0 * i) / d) for i in range(d // 2)]
    if not rope_scaling:
        return plain
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if kind == "default":
        return plain
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not implemented here")
    factor = float(rope_scaling["factor"])
    low = float(rope_scaling["low_freq_factor"])
    high = float(rope_scaling["high_freq_factor"])
    context = float(rope_scaling["original_max_position_embeddings"])
    scaled = []
    for f in plain:
        wavelength = 2.0 * math.pi / f
        if wavelength < context / high:      # many turns within the original context
            scaled.append(f)
        elif wavelength > context / low:     # less than one turn: stretch by factor
            scaled.append(f / factor)
        else:                                # in between: blend the two
            s = (context / wavelength - low) / (high - low)
            scaled.append((1.0 - s) * f / factor + s * f)
    return scaled


class Llama:
    def __init__(self, config, weights, dtype):
        self.c = config
        self.w = {k: v.to(dtype) for k, v in weights.items()}
        self.hq = config["num_attention_heads"]
        self.hkv = config.get("num_key_value_heads") or self.hq
        self.d = config["hidden_size"] // self.hq
        self.eps = config.get("rms_norm_eps", 1e-6)
        self.theta = config.get("rope_theta", 10000.0)
        self.inv_freq = rope_inverse_frequencies(self.theta, self.d,
                                                 config.get("rope_scaling"))
        self.dtype = dtype
        if config.get("tie_word_embeddings", False) or "lm_head.weight" not in self.w:
            self.lm_head = self.w["model.embed_tokens.weight"]
        else:
            self.lm_head = self.w["lm_head.weight"]

    def rms_norm(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def rope(self, t):
        # cos/sin [t, d] with the HF half-split layout.
        inv_freq = torch.tensor(self.inv_freq, dtype=torch.float64)    # [d/2]
        pos = torch.arange(t, dtype=torch.float64)
        freqs = pos[:, None] * inv_freq[None, :]          # [t, d/2]
        emb = torch.cat([freqs, freqs], dim=-1)           # [t, d]
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @staticmethod
    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat([-x[..., half:], x[..., :half]], dim=-1)

    def attention(self, x, prefix, cos, sin):
        t = x.shape[0]
        q = (x @ self.w[prefix + "q_proj.weight"].T).view(t, self.hq, self.d)   # [t, hq, d]
        k = (x @ self.w[prefix + "k_proj.weight"].T).view(t, self.hkv, self.d)  # [t, hkv, d]
        v = (x @ self.w[prefix + "v_proj.weight"].T).view(t, self.hkv, self.d)
        q = q * cos[:, None, :] + self.rotate_half(q) * sin[:, None, :]
        k = k * cos[:, None, :] + self.rotate_half(k) * sin[:, None, :]
        rep = self.hq // self.hkv
        k = k.repeat_interleave(rep, dim=1)                                     # [t, hq, d]
        v = v.repeat_interleave(rep, dim=1)
        q, k, v = (z.transpose(0, 1) for z in (q, k, v))                        # [hq, t, d]
        scores = (q @ k.transpose(1, 2)) / math.sqrt(self.d)                    # [hq, t, t]
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v                                 # [hq, t, d]
        out = out.transpose(0, 1).reshape(t, self.hq * self.d)                  # [t, hq*d]
        return out @ self.w[prefix + "o_proj.weight"].T

    def mlp(self, x, prefix):
        gate = x @ self.w[prefix + "gate_proj.weight"].T
        up = x @ self.w[prefix + "up_proj.weight"].T
        return (torch.nn.functional.silu(gate) * up) @ self.w[prefix + "down_proj.weight"].T

    def logits(self, ids):
        x = self.w["model.embed_tokens.weight"][ids]                            # [t, H]
        cos, sin = self.rope(ids.shape[0])
        for i in range(self.c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            x = x + self.attention(self.rms_norm(x, self.w[p + "input_layernorm.weight"]),
                                   p + "self_attn.", cos, sin)
            x = x + self.mlp(self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"]),
                             p + "mlp.")
        x = self.rms_norm(x, self.w["model.norm.weight"])
        return x @ self.lm_head.T                                               # [t, V]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf", required=True, help="HF Llama directory")
    ap.add_argument("--tokens", required=True, help="flat little-endian uint32 token file")
    ap.add_argument("--seq-len", type=int, required=True, help="window length T")
    ap.add_argument("--max-windows", type=int, default=0, help="0 = all windows")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    args = ap.parse_args()

    with open(os.path.join(args.hf, "config.json")) as f:
        config = json.load(f)
    dtype = getattr(torch, args.dtype)
    model = Llama(config, load_weights(args.hf), dtype)
    tokens = np.fromfile(args.tokens, dtype="<u4").astype(np.int64)
    n, t = tokens.shape[0], args.seq_len
    if tokens.max(initial=0) >= config["vocab_size"]:
        sys.exit(f"{args.tokens}: token {tokens.max()} >= vocab_size {config['vocab_size']}")
    windows = n // t
    if args.max_windows > 0:
        windows = min(windows, args.max_windows)
    if windows == 0:
        sys.exit(f"{args.tokens}: {n} tokens, fewer than one window of {t}")
    total, count = 0.0, 0
    with torch.no_grad():
        for k in range(windows):
            chunk = torch.from_numpy(tokens[k * t:k * t + t + 1])
            inputs = chunk[:t]
            targets = chunk[1:]
            logits = model.logits(inputs)[: targets.shape[0]]
            loss = torch.nn.functional.cross_entropy(logits.double(), targets, reduction="sum")
            total += loss.item()
            count += targets.shape[0]
    print(json.dumps({"loss": total / count, "tokens": count, "windows": windows}))


if __name__ == "__main__":
    main()
