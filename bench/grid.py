#!/usr/bin/python3
"""A sweep's runs against their PyTorch twin: runs per hour of an experiment's grid on this machine.

    bench/grid.py [--qkv build/qkv] [--experiment symmetry] [--steps 300] [--rounds 3] [--jobs 2]

For each configuration of the experiment's sweep (`qkv experiment NAME --print`), the same model
trains in PyTorch: the token and position embeddings, pre-LayerNorm attention blocks with W_q,
W_k, W_v and W_o (tied: W_k = W_q; symmetric: k = q ⊙ s with s half +1, half −1 in each head;
identity: no W_q, W_k, W_v; identity-qk: no W_q, W_k), the readout (pointer: head 0's scores of the last layer over the keys; token: a
final LayerNorm and a linear head), cross-entropy, gradient clipping at 1 and Adam, at the run's
batch size, one thread. Its batches are random tokens drawn before timing (PyTorch gets its data
for free; qkv samples the task each step). qkv's rate is `qkv train` on the same options with one
thread, timed by the run itself (its "seconds": the steps alone, no start-up). Rounds alternate
the two; each rate is the median. Runs per hour is then what `--jobs` processes of one thread
each (a sweep's `-j`) finish of the whole grid at its budget: 3600 · jobs / Σ_runs steps / rate.
"""
import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F


def qkv_json(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"grid.py: {' '.join(cmd)} failed with status {done.returncode}:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def runs_of(sweep):
    """(label, task, options, count) for each configuration of a sweep file, as qkv plans them."""
    out = []
    grid = sweep.get("grid", {})
    axes = []
    for key, values in grid.items():
        if isinstance(values, dict):
            axes.append([(name, opts) for name, opts in values.items()])
        else:
            axes.append([(str(v), {key: v}) for v in values])
    seeds = sweep.get("seeds", {}).get("count", 1)
    for entry in sweep["tasks"]:
        task, task_opts = (entry, {}) if isinstance(entry, str) else (entry["task"], {k: v for k, v in entry.items() if k not in ("task", "label")})
        name = entry.get("label") if isinstance(entry, dict) else None
        combos = [[]]
        for axis in axes:
            combos = [c + [v] for c in combos for v in axis]
        for combo in combos:
            options = dict(sweep.get("fixed", {}), **task_opts)
            label = [name or task + "".join(f" {k}={v}" for k, v in task_opts.items())]
            for name, opts in combo:
                options.update(opts)
                label.append(name)
            out.append((" / ".join(label), task, options, seeds))
    return out


def safetensors_elements(path):
    """The number of values a safetensors file holds (its header's shapes)."""
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def train_args(task, options, steps):
    args = [task]
    for key, value in options.items():
        if key == "steps":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args += [flag] if value else []
        else:
            args += [flag, str(value)]
    return args + ["--steps", str(steps), "--threads", "1"]


class Twin(torch.nn.Module):
    """qkv's Transformer (nn/transformer.cpp) as its config.json describes it."""

    def __init__(self, c):
        super().__init__()
        m = c["model"]
        self.V, self.D, self.H, self.L, self.T = m["vocab_size"], m["d_model"], m["heads"], m["layers"], m["max_len"]
        self.dh = m["d_head"] or self.D // self.H
        self.qk, self.proj, self.readout = m["qk"], m["proj"], m["readout"]
        causal = m["causal_layers"] or [m["causal"]] * self.L
        self.scale = 1 / math.sqrt(self.dh) if m["scale"] else 1.0
        self.tok = torch.nn.Embedding(self.V, self.D)
        self.pos = torch.nn.Parameter(torch.randn(self.T, self.D) * 0.02)
        self.ln = torch.nn.ModuleList(torch.nn.LayerNorm(self.D) for _ in range(self.L))
        width = self.H * self.dh
        learned = self.proj not in ("identity", "identity-qk")
        self.wq = torch.nn.ModuleList(torch.nn.Linear(self.D, width) for _ in range(self.L)) if learned else None
        self.wk = torch.nn.ModuleList(torch.nn.Linear(self.D, width) for _ in range(self.L)) if learned and self.qk == "untied" else None
        self.wv = torch.nn.ModuleList(torch.nn.Linear(self.D, width) for _ in range(self.L)) if self.proj != "identity" else None
        self.wo = torch.nn.ModuleList(torch.nn.Linear(width, self.D) for _ in range(self.L))
        # Symmetric keys: the first half (rounded up) of each head's dimensions +1, the rest -1.
        self.register_buffer("signs", torch.tensor([1.0 if i % self.dh < (self.dh + 1) // 2 else -1.0 for i in range(width)]))
        self.register_buffer("blocked", torch.ones(self.T, self.T, dtype=torch.bool).triu(1))
        self.causal = causal
        self.ln_final = torch.nn.LayerNorm(self.D)  # as qkv keeps it, unused by the pointer readout
        if self.readout == "token":
            self.head = torch.nn.Linear(self.D, m["n_classes"])

    def forward(self, ids, targets):
        B, T = ids.shape
        x = self.tok(ids) + self.pos[:T]
        scores = None
        for l in range(self.L):
            h = self.ln[l](x)
            if self.wq is None:
                q = h
                k = h * self.signs if self.qk == "symmetric" else h
                v = h if self.wv is None else self.wv[l](h)
            else:
                q = self.wq[l](h)
                k = self.wk[l](h) if self.wk is not None else q * self.signs if self.qk == "symmetric" else q
                v = self.wv[l](h)
            q, k, v = (t.reshape(B, T, self.H, -1).transpose(1, 2) for t in (q, k, v))
            s = q @ k.transpose(-2, -1) * self.scale
            if self.causal[l]:
                s = s.masked_fill(self.blocked[:T, :T], float("-inf"))
            z = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1)
            x = x + self.wo[l](z)
            scores = s
        logits = scores[:, 0] if self.readout == "pointer" else self.head(self.ln_final(x))
        return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-100)


def torch_rate(config, steps, seconds_budget=None):
    """Steps per second of the twin of a run's config.json, on one thread."""
    torch.manual_seed(0)
    model = Twin(config)
    B, T = config["batch"], config["model"]["max_len"]
    batches = []
    for _ in range(8):
        ids = torch.randint(0, model.V, (B, T))
        if model.readout == "pointer":  # a key the query sees: at or before it when causal
            limit = torch.arange(1, T + 1) if model.causal[-1] else torch.full((T,), T)
            targets = (torch.rand(B, T) * limit).long()
        else:
            targets = torch.randint(0, config["model"]["n_classes"], (B, T))
        batches.append((ids, targets))
    adam = torch.optim.Adam(model.parameters(), lr=config["lr"])

    def step(i):
        adam.zero_grad(set_to_none=True)
        loss = model(*batches[i % len(batches)])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        adam.step()

    for i in range(10):
        step(i)
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    return steps / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qkv", default="build/qkv")
    parser.add_argument("--experiment", default="symmetry")
    parser.add_argument("--steps", type=int, default=300, help="steps each rate is timed over")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sweep = json.loads(subprocess.run([args.qkv, "experiment", args.experiment, "--print"], capture_output=True,
                                      text=True, check=True).stdout)
    budget = sweep.get("fixed", {}).get("steps")
    if budget is None:
        sys.exit(f"grid.py: the {args.experiment} sweep gives no \"fixed\" \"steps\": the budget its runs are counted at")
    rows, qkv_time, torch_time, runs = [], 0.0, 0.0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for label, task, options, count in runs_of(sweep):
            out = os.path.join(tmp, "run")
            cmd = [args.qkv, "train"] + train_args(task, options, args.steps) + ["--out", out, "--force"]
            qkv_rates, torch_rates = [], []
            config = None
            for _ in range(args.rounds):
                result = qkv_json(cmd)
                qkv_rates.append(result["steps"] / result["seconds"])
                if config is None:
                    with open(os.path.join(out, "config.json")) as f:
                        config = json.load(f)
                    twin = sum(p.numel() for p in Twin(config).parameters())
                    held = safetensors_elements(os.path.join(out, "model.safetensors"))
                    if twin != held:
                        sys.exit(f"grid.py: {label}: the twin has {twin} parameters, qkv's model {held}")
                torch_rates.append(torch_rate(config, args.steps))
            q, t = statistics.median(qkv_rates), statistics.median(torch_rates)
            rows.append((label, q, t))
            qkv_time += count * budget / q
            torch_time += count * budget / t
            runs += count
            print(f"{label}: qkv {q:.0f} steps/s, PyTorch {t:.0f} steps/s", file=sys.stderr, flush=True)
    print(f"{args.experiment}: {runs} runs of {budget} steps; rates on 1 thread over {args.steps} steps, "
          f"median of {args.rounds} rounds; PyTorch {torch.__version__}\n")
    print("| configuration | qkv steps/s | PyTorch steps/s | qkv / PyTorch |\n|---|---:|---:|---:|")
    for label, q, t in rows:
        print(f"| {label} | {q:.0f} | {t:.0f} | {q / t:.1f}x |")
    print(f"\nOn {args.jobs} processes: qkv {3600 * args.jobs * runs / qkv_time:.0f} runs/hour "
          f"({qkv_time / args.jobs / 60:.1f} minutes of training for the grid), PyTorch "
          f"{3600 * args.jobs * runs / torch_time:.0f} runs/hour ({torch_time / args.jobs / 60:.1f} minutes): "
          f"{torch_time / qkv_time:.1f}x")


if __name__ == "__main__":
    main()
