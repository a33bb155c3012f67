#!/usr/bin/python3
"""The PyTorch twin of qkv-bench: the same model, step and JSON line.

    OPENBLAS_NUM_THREADS=1 bench/torch_bench.py --config tiny [--threads N] [--seconds S]

One step is zero_grad + forward + backward + Adam(lr=1e-3), float32, on one batch of random tokens
and targets drawn with a fixed seed:
    x = tok[ids] + pos,  L x { x = x + MHA(x) } (causal, biases on all four projections),
    loss = cross_entropy(Linear(D, V)(x), targets)  (mean over all B*T positions).
MHA is torch.nn.MultiheadAttention, which packs W_q, W_k, W_v into one in_proj_weight, as qkv
runs them as one GEMM.

    OPENBLAS_NUM_THREADS=1 bench/torch_bench.py --decode --config small --batch 1 [--no-cache] ...

times greedy generation instead, as qkv-bench --decode does: the same model with positions for a
start token and 256 more writes them one at a time under torch.no_grad(). Without the cache each
step runs the model (nn.MultiheadAttention's forward) on the whole sequence so far; with it, a
loop of its own keeps each layer's keys and values in buffers with room for every position and
runs the newest token alone through the layer's weights (in_proj, the heads' softmax(q kᵀ/√d) v,
out_proj): nn.MultiheadAttention in PyTorch 1.13 has no cache.
"""
import argparse
import json
import resource
import time

import torch
import torch.nn.functional as F

# name: (V, D, H, L, T, B); bench/config.hpp holds the same table.
CONFIGS = {
    "tiny": (8, 32, 4, 2, 32, 64),
    "small": (16, 64, 4, 2, 64, 64),
    "medium": (64, 256, 8, 2, 128, 32),
    "long": (64, 128, 4, 2, 512, 8),
    "longer": (64, 128, 4, 2, 1024, 4),
    "wide": (64, 512, 8, 4, 128, 16),
}


DECODE_TOKENS = 256  # bench/config.hpp's decode_tokens


def step_flops(V, D, H, L, T, B):
    """The FLOPs of the step's matrix products, as bench/config.hpp's step_flops counts them."""
    N = B * T
    layer = 2 * N * D * 3 * D + 2 * (2 * N * T * D) + 2 * N * D * D
    return 3 * (L * layer + 2 * N * D * V)


class BenchModel(torch.nn.Module):
    def __init__(self, V, D, H, L, T):
        super().__init__()
        self.heads = H
        self.tok = torch.nn.Embedding(V, D)
        self.pos = torch.nn.Parameter(torch.randn(T, D))
        self.layers = torch.nn.ModuleList(
            torch.nn.MultiheadAttention(D, H, bias=True, batch_first=True) for _ in range(L))
        self.head = torch.nn.Linear(D, V)
        # True above the diagonal: a key after the query, which PyTorch's attn_mask blocks.
        self.register_buffer("blocked", torch.ones(T, T, dtype=torch.bool).triu(1))

    def forward(self, ids, targets):
        x = self.tok(ids) + self.pos
        for layer in self.layers:
            x = x + layer(x, x, x, attn_mask=self.blocked, need_weights=False)[0]
        logits = self.head(x)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def logits(self, ids):
        """The logits of a whole sequence (B, T), causal."""
        T = ids.shape[1]
        x = self.tok(ids) + self.pos[:T]
        for layer in self.layers:
            x = x + layer(x, x, x, attn_mask=self.blocked[:T, :T], need_weights=False)[0]
        return self.head(x)

    def logits_cached(self, ids, offset, caches):
        """The logits of the newest tokens (B, n) at positions offset…, against each layer's cached
        keys and values: buffers (B, H, positions, d_head) with room for every position, into which
        these positions' are written (no copy of the past, as qkv's cache appends in place)."""
        B, n = ids.shape
        x = self.tok(ids) + self.pos[offset:offset + n]
        for layer, (k_buf, v_buf) in zip(self.layers, caches):
            D = x.shape[-1]
            d = D // self.heads
            q, k, v = F.linear(x, layer.in_proj_weight, layer.in_proj_bias).chunk(3, dim=-1)
            q, k, v = (t.reshape(B, n, self.heads, d).transpose(1, 2) for t in (q, k, v))
            k_buf[:, :, offset:offset + n] = k
            v_buf[:, :, offset:offset + n] = v
            k, v = k_buf[:, :, :offset + n], v_buf[:, :, :offset + n]
            scores = q @ k.transpose(-2, -1) / d ** 0.5
            if n > 1:  # the new positions among themselves: causal
                scores = scores.masked_fill(self.blocked[offset:offset + n, :offset + n], float("-inf"))
            z = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, n, D)
            x = x + layer.out_proj(z)
        return self.head(x)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def timed(step, warmup, seconds):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup:
        step()
    steps, t0 = 0, time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds or steps < 3:
        step()
        steps += 1
        elapsed = time.perf_counter() - t0
    return steps, elapsed


def decode(args):
    """Greedy generation of DECODE_TOKENS tokens after a random start token per sequence."""
    V, D, H, L, T, _ = CONFIGS[args.config]
    B, count = args.batch, DECODE_TOKENS
    base_rss = peak_rss_mb()
    model = BenchModel(V, D, H, L, count + 1)
    model.eval()
    start = torch.randint(0, V, (B, 1))

    @torch.no_grad()
    def generate():
        seq = start
        caches = [(torch.empty(B, H, count + 1, D // H), torch.empty(B, H, count + 1, D // H)) for _ in range(L)]
        for t in range(count):
            logits = model.logits_cached(seq[:, t:t + 1], t, caches) if not args.no_cache else model.logits(seq)
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return seq

    runs, elapsed = timed(generate, min(1.0, args.seconds / 4), args.seconds)
    print(json.dumps({
        "impl": "torch",
        "config": args.config,
        "batch": B,
        "cache": not args.no_cache,
        "threads": args.threads,
        "tokens_per_s": runs * B * count / elapsed,
        "ms_per_token": 1e3 * elapsed / (runs * count),
        "params": sum(p.numel() for p in model.parameters()),
        "peak_rss_mb": peak_rss_mb(),
        "runs": runs,
        "base_rss_mb": base_rss,
        "torch": torch.__version__,
    }))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, choices=CONFIGS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--decode", action="store_true", help="time greedy generation of 256 tokens")
    parser.add_argument("--batch", type=int, help="sequences a training step takes (default: the config's), "
                        "or generated at once (--decode; default 1)")
    parser.add_argument("--length", type=int, help="sequence length of a training step, instead of the config's")
    parser.add_argument("--no-cache", action="store_true", help="run the whole sequence at every step (--decode)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.decode:
        if args.length:
            parser.error("--length is for training steps; --decode generates 256 tokens")
        args.batch = args.batch or 1
        return decode(args)
    V, D, H, L, T, B = CONFIGS[args.config]
    T, B = args.length or T, args.batch or B
    base_rss = peak_rss_mb()
    model = BenchModel(V, D, H, L, T)
    model.train()
    ids = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    last = {}

    def step():
        adam.zero_grad(set_to_none=True)
        loss = model(ids, targets)
        loss.backward()
        adam.step()
        last["loss"] = loss.item()

    steps, elapsed = timed(step, min(1.0, args.seconds / 4), args.seconds)
    per_step = elapsed / steps
    print(json.dumps({
        "impl": "torch",
        "config": args.config,
        "length": T,
        "batch": B,
        "threads": args.threads,
        "steps_per_s": 1.0 / per_step,
        "ms_per_step": 1e3 * per_step,
        "params": sum(p.numel() for p in model.parameters()),
        "gflops": step_flops(V, D, H, L, T, B) / per_step / 1e9,
        "peak_rss_mb": peak_rss_mb(),
        "steps": steps,
        "loss": last["loss"],
        "base_rss_mb": base_rss,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
