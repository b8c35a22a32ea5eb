#!/usr/bin/python3
"""Eager PyTorch (1.13, Debian python3-torch) training throughput of the same Llama the
engine trains: one CPU process, AdamW, fp32. Prints one JSON line
{"impl":"pytorch-eager","tokens_per_s":..,"step_seconds":[..]}.

Run: /usr/bin/python3 bench/train_eager.py --seq 2048 --steps 5
Attention is the eager masked-softmax form (torch 1.13 has no fused SDPA).
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


class Layer(nn.Module):
    def __init__(self, H, I, hq, hkv):
        super().__init__()
        d = H // hq
        self.hq, self.hkv, self.d = hq, hkv, d
        self.q = nn.Linear(H, hq * d, bias=False)
        self.k = nn.Linear(H, hkv * d, bias=False)
        self.v = nn.Linear(H, hkv * d, bias=False)
        self.o = nn.Linear(hq * d, H, bias=False)
        self.gate = nn.Linear(H, I, bias=False)
        self.up = nn.Linear(H, I, bias=False)
        self.down = nn.Linear(I, H, bias=False)
        self.n1, self.n2 = RMSNorm(H), RMSNorm(H)

    def forward(self, x, cos, sin, mask):
        b, s, _ = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, s, self.hq, self.d).transpose(1, 2)
        k = self.k(h).view(b, s, self.hkv, self.d).transpose(1, 2)
        v = self.v(h).view(b, s, self.hkv, self.d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.hq // self.hkv
        k = k.repeat_interleave(rep, 1)
        v = v.repeat_interleave(rep, 1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.d)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(b, s, -1)
        x = x + self.o(o)
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=688)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch default)")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    emb = nn.Embedding(a.vocab, a.hidden)
    layers = nn.ModuleList([Layer(a.hidden, a.inter, a.heads, a.kv) for _ in range(a.layers)])
    norm = RMSNorm(a.hidden)
    head = nn.Linear(a.hidden, a.vocab, bias=False)
    params = list(emb.parameters()) + list(layers.parameters()) + list(norm.parameters()) + \
        list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    d = a.hidden // a.heads
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    f = torch.arange(a.seq).float()[:, None] * inv[None]
    e = torch.cat([f, f], -1)
    cos, sin = e.cos()[None, None], e.sin()[None, None]
    mask = torch.ones(a.seq, a.seq, dtype=torch.bool).triu(1)
    times = []
    for _ in range(a.steps):
        tok = torch.randint(0, a.vocab, (1, a.seq + 1))
        t0 = time.perf_counter()
        x = emb(tok[:, :-1])
        for l in layers:
            x = l(x, cos, sin, mask)
        logits = head(norm(x))
        loss = F.cross_entropy(logits.view(-1, a.vocab), tok[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    steady = sorted(times[1:] or times)
    med = steady[len(steady) // 2]
    print(json.dumps({"impl": "pytorch-eager", "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "seq_len": a.seq,
                      "tokens_per_s": a.seq / med, "step_seconds": times}))


if __name__ == "__main__":
    main()
