#!/usr/bin/python3
"""The grokking run's speed: `qkv train modadd` and its PyTorch twin (bench/grokking_torch.py) side by side.

    bench/grokking.py [--qkv build/qkv] [--threads 1,2] [--steps 300] [--rounds 3] [--full-steps 40000]

Per thread count, `rounds` rounds of qkv and PyTorch, alternating, each a fresh run of --steps of
Nanda et al.'s modular-addition training (p 113, full batch over 3,830 pairs, the held-out loss every
100 steps); each cell is the median over rounds, and the last column the time of the paper's 40,000
steps at that rate. qkv's steps per second are its run's (seconds in its final JSON line, which
leaves out starting up); PyTorch's are measured the same way, around its loop.
"""
import argparse
import datetime
import os
import statistics
import sys
import tempfile

from compare import run_json  # the last JSON line of a command, or exit naming it

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qkv", default="build/qkv")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--full-steps", type=int, default=40000)
    args = parser.parse_args()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # PyTorch threads through torch.set_num_threads
    rows, version = [], ""
    with tempfile.TemporaryDirectory() as tmp:
        for threads in (int(t) for t in args.threads.split(",")):
            rates = {"qkv": [], "torch": []}
            for _ in range(args.rounds):
                q = run_json([args.qkv, "train", "modadd", "--steps", str(args.steps), "--threads", str(threads),
                               "--out", os.path.join(tmp, "run"), "--force"], env)
                rates["qkv"].append(q["steps"] / q["seconds"])
                t = run_json([sys.executable, os.path.join(HERE, "grokking_torch.py"), "--steps", str(args.steps),
                               "--threads", str(threads)], env)
                rates["torch"].append(t["steps_per_second"])
                version = t["engine"]
            rows.append((threads, statistics.median(rates["qkv"]), statistics.median(rates["torch"])))
    print(f"{datetime.date.today().isoformat()}, {os.cpu_count()} CPUs, {version}; {args.steps} steps a run, median of "
          f"{args.rounds} rounds\n")
    print(f"| threads | qkv steps/s | PyTorch steps/s | qkv / PyTorch | qkv {args.full_steps:,} steps | "
          f"PyTorch {args.full_steps:,} steps |")
    print("|---:|---:|---:|---:|---:|---:|")
    for threads, q, t in rows:
        print(f"| {threads} | {q:.1f} | {t:.2f} | {q / t:.1f}x | {args.full_steps / q / 60:.0f} min | "
              f"{args.full_steps / t / 60:.0f} min |")


if __name__ == "__main__":
    main()
