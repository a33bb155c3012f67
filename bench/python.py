#!/usr/bin/python3
"""Training from Python against the program and PyTorch: steps per second on the bracket defaults.

    PYTHONPATH=build/python bench/python.py [--qkv build/qkv] [--steps 2000] [--rounds 3]

Four ways to train the same run (brackets, its defaults: 2 layers, 2 heads, d_model 16, batch 32,
lr 1e-2 with 100 warmup steps and a cosine to 0.1x, clipping at 1, Adam), one thread each:
  program      `qkv train brackets`, its own "seconds" (the steps alone, no start-up);
  python       qkv.train("brackets") from Python, the same library loop, "seconds" as above;
  python task  qkv.train(Brackets()) with the task written below in Python (numpy): its rate with
               the time spent in its sample() counted, and without it (the batch generation
               measured apart, by a timer around each call);
  pytorch      the same model in PyTorch (qkv.to_torch of the model qkv would start from), Adam,
               clipping and the same schedule, on batches of the same Python task drawn before
               timing: its rate without batch generation.
Rounds alternate the four; each rate is the median of its rounds. Prints a markdown table.
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import qkv

BOS, OPEN_ROUND, OPEN_SQUARE, PAD = 0, 1, 3, 5


class Brackets:
    """Dyck-2 as the built-in task draws it: BOS then 4-24 brackets, depth at most 6; each closer
    points at its opener."""
    name = "brackets-python"
    vocab_size = 6
    readout = "pointer"
    max_len = 25
    pad = PAD

    def __init__(self):
        self.sampling, self.calls = 0.0, 0  # seconds spent in sample(), and its calls

    def sample(self, batch, seed):
        start = time.perf_counter()
        rng = np.random.default_rng(seed)
        lengths = 4 + 2 * rng.integers(0, 11, size=batch)
        coins = rng.random((batch, 24, 2)) < 0.5
        T = int(lengths.max()) + 1
        tokens = np.full((batch, T), PAD, dtype=np.int64)
        targets = np.full((batch, T), -1, dtype=np.int64)
        tokens[:, 0] = BOS
        for b in range(batch):
            length, stack = int(lengths[b]), []
            for pos in range(length):
                depth = len(stack)
                if depth == 0 or (depth < 6 and depth < length - pos and coins[b, pos, 0]):
                    kind = OPEN_ROUND if coins[b, pos, 1] else OPEN_SQUARE
                    stack.append((pos + 1, kind))
                    tokens[b, pos + 1] = kind
                else:
                    where, kind = stack.pop()
                    tokens[b, pos + 1] = kind + 1
                    targets[b, pos + 1] = where
        self.sampling += time.perf_counter() - start
        self.calls += 1
        return {"tokens": tokens, "targets": targets}


def program_rate(qkv_program, steps, out):
    done = subprocess.run([qkv_program, "train", "brackets", "--steps", str(steps), "--out", out, "--force"],
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["steps"] / result["seconds"], result["accuracy"]


def python_rate(steps, out):
    result = qkv.train("brackets", out=out, force=True, steps=steps)
    return result["steps"] / result["seconds"], result["accuracy"]


def python_task_rates(steps, out):
    task = Brackets()
    qkv.register_task(task)  # its checks draw batches: not counted
    task.sampling, task.calls = 0.0, 0
    result = qkv.train(task.name, out=out, force=True, steps=steps, lr=1e-2)
    # The run's seconds hold one batch a step (its evaluation's batches come after them).
    per_batch = task.sampling / task.calls
    return (result["steps"] / result["seconds"], result["steps"] / (result["seconds"] - steps * per_batch), per_batch,
            result["accuracy"])


def torch_rate(steps, config):
    import torch
    torch.set_num_threads(1)
    module = qkv.to_torch(qkv.Transformer(config, seed=0))
    task = Brackets()
    batches = [task.sample(32, s) for s in range(64)]
    batches = [(torch.tensor(b["tokens"]), torch.tensor(b["targets"])) for b in batches]
    adam = torch.optim.Adam(module.parameters(), lr=1e-2)
    warmup, floor = 100, 0.1

    def lr_at(step):
        if step < warmup:
            return 1e-2 * (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 1e-2 * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))

    start = time.perf_counter()
    for step in range(steps):
        tokens, targets = batches[step % len(batches)]
        for group in adam.param_groups:
            group["lr"] = lr_at(step)
        adam.zero_grad(set_to_none=True)
        scores = module(tokens)
        flat = targets.reshape(-1)
        loss = torch.nn.functional.cross_entropy(scores.reshape(-1, scores.shape[-1]), flat.masked_fill(flat < 0, -100),
                                                 ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        adam.step()
    return steps / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qkv", default="build/qkv")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates = {k: [] for k in ("program", "python", "python task", "python task, generation apart", "pytorch")}
    sampling, accuracy = [], {k: [] for k in rates}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            rate, acc = program_rate(args.qkv, args.steps, os.path.join(tmp, "program"))
            rates["program"].append(rate)
            accuracy["program"].append(acc)
            rate, acc = python_rate(args.steps, os.path.join(tmp, "python"))
            rates["python"].append(rate)
            accuracy["python"].append(acc)
            with_generation, apart, seconds, acc = python_task_rates(args.steps, os.path.join(tmp, "task"))
            rates["python task"].append(with_generation)
            rates["python task, generation apart"].append(apart)
            accuracy["python task"].append(acc)
            sampling.append(seconds)
            with open(os.path.join(tmp, "python", "config.json")) as f:
                config = json.load(f)["model"]
            rates["pytorch"].append(torch_rate(args.steps, config))
    program = statistics.median(rates["program"])
    print(f"brackets defaults, {args.steps} steps, one thread, median of {args.rounds} rounds; "
          f"{platform.processor() or platform.machine()}; torch {__import__('torch').__version__}\n")
    print("| training | steps/s | × the program's | held-out accuracy |")
    print("|---|---:|---:|---:|")
    for name, values in rates.items():
        rate = statistics.median(values)
        acc = f"{statistics.median(accuracy[name]):.4f}" if accuracy[name] else ""
        print(f"| {name} | {rate:,.0f} | {rate / program:.2f} | {acc} |")
    print(f"\nThe Python task's sample(): {1000 * statistics.median(sampling):.3f} ms a batch (median of rounds).")


if __name__ == "__main__":
    sys.exit(main())
