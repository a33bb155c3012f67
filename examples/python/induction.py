#!/usr/bin/python3
"""The induction circuit, found from Python: train the induction task, then read which head does
what from the attention patterns, the composition scores and ablation.

    PYTHONPATH=build/python examples/python/induction.py [OUT]

A block of distinct tokens repeated twice; from the second copy on, the model predicts the next
token by finding the earlier copy of the current one and reading what came after it. Two heads do
it: a previous-token head in layer 0 writes each position's predecessor into the stream, and an
induction head in layer 1 whose keys read that (K-composition) attends to the position after the
earlier copy. Exits 1 when the run does not show the circuit.
"""
import sys
import tempfile

import numpy as np

import qkv


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp() + "/induction"
    result = qkv.train("induction", out=out, force=True)
    print(f"trained: accuracy {result['accuracy']:.3f} after {result['steps']} steps ({result['seconds']:.1f} s)")
    model = qkv.load_run(out)
    task = qkv.task("induction")

    # Attention on a batch of the task's sequences. A previous-token head puts its weight on the
    # position before the query (the mean over every query past the first, as TransformerLens's
    # head detector scores it); an induction head, on the second copy, on the position after the
    # earlier copy of the query's token.
    batch = task.sample(64, seed=99)
    tokens, targets = batch["tokens"], batch["targets"]
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    B, T = tokens.shape
    by_offset = np.zeros((2, 6))  # mean weight on the key `offset` positions back, per layer
    induction = np.zeros(2)
    queries = copies = 0
    for b in range(B):
        second = np.nonzero(targets[b] != -100)[0]
        block = second[0] if len(second) else T  # the first copy's length: where the second starts
        for i in range(5, T):
            for layer in range(2):
                by_offset[layer] += cache[f"blocks.{layer}.attn.hook_pattern"][b, 0, i, i - np.arange(6)]
            queries += 1
        for i in second:
            for layer in range(2):
                induction[layer] += cache[f"blocks.{layer}.attn.hook_pattern"][b, 0, i, i - block + 1]
            copies += 1
    by_offset /= queries
    induction /= copies
    previous = by_offset[:, 1]
    others = np.delete(by_offset, 1, axis=1).max(axis=1)
    print(f"weight on the previous position:        L0H0 {previous[0]:.3f}   L1H0 {previous[1]:.3f}")
    print(f"  (on any other of the last 6 at most:  L0H0 {others[0]:.3f}   L1H0 {others[1]:.3f})")
    print(f"weight after the earlier copy:          L0H0 {induction[0]:.3f}   L1H0 {induction[1]:.3f}")

    # How much layer 1's head reads layer 0's through its queries, keys and values.
    scores = {kind: qkv.composition_score(model, 0, 0, 1, 0, kind) for kind in "qkv"}
    print("composition L0H0 -> L1H0: " + ", ".join(f"{k.upper()} {v:.3f}" for k, v in scores.items()))

    # Each head zero-ablated: how much accuracy it holds up.
    ablation = qkv.ablate(out, n=512)
    clean = ablation["clean"]["accuracy"]
    drops = {f"L{h['layer']}H{h['head']}": clean - h["zero"]["accuracy"] for h in ablation["heads"]}
    print(f"accuracy {clean:.3f}; zero-ablated, it drops by " + ", ".join(f"{k} {v:.3f}" for k, v in drops.items()))

    found = previous[0] > 0.4 and previous[0] > 5 * others[0] and induction[1] > 0.5 and min(drops.values()) > 0.3
    print("the circuit:", "previous-token head L0H0, induction head L1H0" if found else "NOT FOUND")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
