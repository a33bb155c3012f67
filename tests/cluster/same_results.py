"""Two sweeps' results.jsonl hold the same runs with the same numbers, but for the seconds (and the
token of the pass of workers that trained each).
Usage: same_results.py A B"""
import json
import sys


def runs(path):
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            r.pop("seconds")
            r.pop("pass")
            out[r["id"]] = r
    return out


a, b = runs(sys.argv[1]), runs(sys.argv[2])
assert a.keys() == b.keys(), f"other runs: {sorted(a.keys() ^ b.keys())}"
for run_id in a:
    assert a[run_id] == b[run_id], f"{run_id} differs:\n{a[run_id]}\n{b[run_id]}"
    assert a[run_id]["status"] == "ok", a[run_id]
print(f"the same {len(a)} runs, with the same numbers")
