#!/usr/bin/python3
"""The PyTorch twin of qkv-bench: the same model, step and JSON line.

    OPENBLAS_NUM_THREADS=1 bench/torch_bench.py --config tiny [--threads N] [--seconds S]

One step is zero_grad + forward + backward + Adam(lr=1e-3), float32, on one batch of random tokens
and targets drawn with a fixed seed:
    x = tok[ids] + pos,  L x { x = x + MHA(x) } (causal, biases on all four projections),
    loss = cross_entropy(Linear(D, V)(x), targets)  (mean over all B*T positions).
MHA is torch.nn.MultiheadAttention, which packs W_q, W_k, W_v into one in_proj_weight, as qkv
runs them as one GEMM.
"""
import argparse
import json
import resource
import time

import torch

# name: (V, D, H, L, T, B); bench/config.hpp holds the same table.
CONFIGS = {
    "tiny": (8, 32, 4, 2, 32, 64),
    "small": (16, 64, 4, 2, 64, 64),
    "medium": (64, 256, 8, 2, 128, 32),
}


def step_flops(V, D, H, L, T, B):
    """The FLOPs of the step's matrix products, as bench/config.hpp's step_flops counts them."""
    N = B * T
    layer = 2 * N * D * 3 * D + 2 * (2 * N * T * D) + 2 * N * D * D
    return 3 * (L * layer + 2 * N * D * V)


class BenchModel(torch.nn.Module):
    def __init__(self, V, D, H, L, T):
        super().__init__()
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, choices=CONFIGS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    V, D, H, L, T, B = CONFIGS[args.config]
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
