#!/usr/bin/python3
"""Runs qkv-bench and its PyTorch twin side by side and prints a markdown table.

    bench/compare.py [--bench build/qkv-bench] [--threads 2] [--seconds 5] [--rounds 3]
                     [--configs tiny,small,medium,long,longer,wide] [--decode-configs small]
                     [--decode-batches 1,16] [--lengths 128,256,512,1024,2048,4096]
                     [--length-config long] [--length-tokens 4096]

First the machine's sgemm rate (qkv-bench --peak, the best of 512-2048 square products through
OpenBLAS, and on x86-64 the FMA limit of the cores, which no product can pass); then, per config,
`rounds` rounds of qkv and PyTorch, alternating, so that both see the same machine. Each cell is
the median over rounds. Then the decoding table: greedy generation of 256 tokens per sequence from
the decode configs' models, for each batch size, with the KV cache and without (--decode-configs
"" leaves it out). Then, with --lengths, the length table: one model (--length-config) trained at
each length T on batches of --length-tokens / T sequences, so that every step holds the same
tokens and only attention's share of the work grows with T.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd, env):
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"compare.py: {' '.join(cmd)} failed with status {done.returncode}:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default="build/qkv-bench")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default="tiny,small,medium,long,longer,wide")
    parser.add_argument("--lengths", default="", help="lengths T to train the --length-config model at")
    parser.add_argument("--length-config", default="long")
    parser.add_argument("--length-tokens", type=int, default=4096, help="tokens per batch at each length")
    parser.add_argument("--decode-configs", default="small")
    parser.add_argument("--decode-batches", default="1,16")
    args = parser.parse_args()

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # PyTorch threads through torch.set_num_threads
    threads = ["--threads", str(args.threads)]
    seconds = ["--seconds", str(args.seconds)]
    peak_run = run_json([args.bench, "--peak", *threads, *seconds], env)
    peak = peak_run["gflops"]
    # What the cores' FMA units allow (x86-64 only): the ceiling over the sgemm peak.
    fma = f"; FMA limit {peak_run['fma_gflops']:.0f} GFLOP/s" if "fma_gflops" in peak_run else ""
    # Both sides get the same OpenBLAS kernels: those qkv chose (it replaces OpenBLAS's SSE3
    # fallback on CPUs that this OpenBLAS does not know).
    env.setdefault("OPENBLAS_CORETYPE", peak_run["blas"])
    qkv_cmd = [args.bench, *threads, *seconds]
    torch_cmd = [sys.executable, os.path.join(HERE, "torch_bench.py"), *threads, *seconds]

    torch_version = None

    def training(name, flags):
        """Medians of `rounds` alternating training runs of qkv and PyTorch, checked to be the same model."""
        nonlocal torch_version
        runs = {"qkv": [], "torch": []}
        for _ in range(args.rounds):
            runs["qkv"].append(run_json([*qkv_cmd, *flags], env))
            runs["torch"].append(run_json([*torch_cmd, *flags], env))
        med = {impl: {key: statistics.median(r[key] for r in rs)
                      for key in ("steps_per_s", "ms_per_step", "gflops", "peak_rss_mb")}
               for impl, rs in runs.items()}
        torch_version = runs["torch"][0]["torch"]
        if runs["qkv"][0]["params"] != runs["torch"][0]["params"]:
            sys.exit(f"compare.py: {name}: qkv has {runs['qkv'][0]['params']} parameters, "
                     f"PyTorch {runs['torch'][0]['params']}: the models differ")
        flops = {impl: rs[0]["gflops"] / rs[0]["steps_per_s"] for impl, rs in runs.items()}
        if abs(flops["qkv"] - flops["torch"]) > 1e-9 * flops["qkv"]:
            sys.exit(f"compare.py: {name}: the FLOP counts per step differ: {flops}")
        return runs["qkv"][0]["params"], med["qkv"], med["torch"]

    rows = [(name, *training(name, ["--config", name])) for name in filter(None, args.configs.split(","))]
    length_rows = []
    for length in (int(t) for t in filter(None, args.lengths.split(","))):
        batch = max(1, args.length_tokens // length)
        flags = ["--config", args.length_config, "--length", str(length), "--batch", str(batch)]
        length_rows.append((length, batch, *training(f"{args.length_config} at T {length}", flags)))

    decode_rows = []
    for name in filter(None, args.decode_configs.split(",")):
        for batch in (int(b) for b in args.decode_batches.split(",")):
            for cache in (True, False):
                flags = ["--decode", "--config", name, "--batch", str(batch)] + ([] if cache else ["--no-cache"])
                runs = {"qkv": [], "torch": []}
                for _ in range(args.rounds):
                    runs["qkv"].append(run_json([*qkv_cmd, *flags], env))
                    runs["torch"].append(run_json([*torch_cmd, *flags], env))
                if runs["qkv"][0]["params"] != runs["torch"][0]["params"]:
                    sys.exit(f"compare.py: decoding {name}: qkv has {runs['qkv'][0]['params']} parameters, "
                             f"PyTorch {runs['torch'][0]['params']}: the models differ")
                med = {impl: statistics.median(r["tokens_per_s"] for r in rs) for impl, rs in runs.items()}
                torch_version = runs["torch"][0]["torch"]
                decode_rows.append((name, runs["qkv"][0]["params"], batch, cache, med["qkv"], med["torch"]))
    print(f"{datetime.date.today().isoformat()}, {cpu_name()}, {os.cpu_count()} CPUs, {args.threads} threads, "
          f"PyTorch {torch_version}, OpenBLAS kernels {env['OPENBLAS_CORETYPE']}; sgemm peak {peak:.0f} GFLOP/s{fma}; median of {args.rounds} rounds of "
          f"{args.seconds:g} s\n")
    if rows:
        print("| config | params | qkv steps/s | PyTorch steps/s | qkv / PyTorch | qkv GFLOP/s (% peak) "
              "| PyTorch GFLOP/s (% peak) | qkv peak MB | PyTorch peak MB | memory qkv / PyTorch |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, params, q, t in rows:
        print(f"| {name} | {params} | {q['steps_per_s']:.1f} | {t['steps_per_s']:.1f} "
              f"| {q['steps_per_s'] / t['steps_per_s']:.2f}x "
              f"| {q['gflops']:.1f} ({100 * q['gflops'] / peak:.0f}%) | {t['gflops']:.1f} ({100 * t['gflops'] / peak:.0f}%) "
              f"| {q['peak_rss_mb']:.0f} | {t['peak_rss_mb']:.0f} | {q['peak_rss_mb'] / t['peak_rss_mb']:.2f} |")

    if length_rows:
        print(f"\nThe {args.length_config} model at lengths T, batch {args.length_tokens} / T (median of {args.rounds} rounds):\n")
        print("| T | batch | qkv ms/step | PyTorch ms/step | qkv / PyTorch | qkv GFLOP/s (% peak) "
              "| qkv peak MB | PyTorch peak MB | memory qkv / PyTorch |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for length, batch, params, q, t in length_rows:
            print(f"| {length} | {batch} | {q['ms_per_step']:.1f} | {t['ms_per_step']:.1f} "
                  f"| {q['steps_per_s'] / t['steps_per_s']:.2f}x | {q['gflops']:.1f} ({100 * q['gflops'] / peak:.0f}%) "
                  f"| {q['peak_rss_mb']:.0f} | {t['peak_rss_mb']:.0f} | {q['peak_rss_mb'] / t['peak_rss_mb']:.2f} |")

    if decode_rows:
        print(f"\nGreedy generation of 256 tokens per sequence after a start token, tokens per second "
              f"(median of {args.rounds} rounds):\n")
        print("| config | params | batch | KV cache | qkv tokens/s | PyTorch tokens/s | qkv / PyTorch |")
        print("|---|---:|---:|---|---:|---:|---:|")
        for name, params, batch, cache, q, t in decode_rows:
            print(f"| {name} | {params} | {batch} | {'yes' if cache else 'no'} | {q:.0f} | {t:.0f} | {q / t:.2f}x |")


if __name__ == "__main__":
    main()
