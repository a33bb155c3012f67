"""Sweeps from Python: the program's runs and results, as a DataFrame."""
import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import qkv

QKV = os.environ.get("QKV_PROGRAM", "qkv")
SPEC = {"tasks": ["rps"], "grid": {"qk": ["untied", "tied"]}, "fixed": {"steps": 40}, "seeds": {"start": 3, "count": 2}}


def same(a, b):
    return (a is None or (isinstance(a, float) and math.isnan(a))) and b == "" or str(a) == b or (
        isinstance(a, float) and b != "" and float(b) == a)


def test_a_sweep_from_python_is_the_programs_and_its_table_is_results_csv(tmp_path):
    pandas = pytest.importorskip("pandas")
    table = qkv.sweep(SPEC, str(tmp_path / "py"), jobs=2)
    assert isinstance(table, pandas.DataFrame)
    assert len(table) == 4 and list(table["qk"]) == ["untied", "untied", "tied", "tied"]
    assert list(table["seed"]) == [3, 4, 3, 4] and (table["status"] == "ok").all()
    with open(tmp_path / "py" / "results.csv") as f:
        rows = list(csv.reader(f))
    assert list(table.columns) == rows[0]
    for (_, row), written in zip(table.iterrows(), rows[1:]):
        assert all(same(row[c], w) for c, w in zip(table.columns, written)), (list(row), written)
    # The same runs from the program: the same numbers, to the bit.
    (tmp_path / "sweep.json").write_text(json.dumps(SPEC))
    subprocess.run([QKV, "sweep", str(tmp_path / "sweep.json"), "--out", str(tmp_path / "cli")], check=True,
                   capture_output=True)
    with open(tmp_path / "cli" / "results.jsonl") as f:
        program = [json.loads(line) for line in f]
    assert [r["accuracy"] for r in program] == list(table["accuracy"])
    assert [r["id"] for r in program] == list(table["id"])
    # Run again: nothing trains, the results stay.
    again = qkv.sweep(SPEC, str(tmp_path / "py"))
    assert list(again["seconds"]) == list(table["seconds"])
    assert list(qkv.sweep_results(str(tmp_path / "py"))["accuracy"]) == list(table["accuracy"])


def test_without_pandas_the_table_is_a_list_of_rows(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError
    rows = qkv.sweep(dict(SPEC, grid={"qk": ["tied"]}, seeds={"start": 0, "count": 1}), str(tmp_path / "s"))
    assert isinstance(rows, list) and len(rows) == 1
    assert rows[0]["qk"] == "tied" and rows[0]["seed"] == 0 and 0 <= rows[0]["accuracy"] <= 1


def test_slices_merge_and_a_missing_run_is_named(tmp_path):
    out = str(tmp_path / "s")
    first = qkv.sweep(SPEC, out, index=0, of=2)
    assert len(first) == 2  # the slice's runs, merged as they are
    with pytest.raises(OSError, match="rps-qk=untied-seed4"):
        qkv.sweep_results(out)
    assert len(qkv.sweep_results(out, partial=True)) == 2
    qkv.sweep(SPEC, out, index=1, of=2)
    assert len(qkv.sweep_results(out)) == 4


class Previous:
    name = "previous-sweep"
    vocab_size = 8
    readout = "pointer"
    max_len = 8

    def sample(self, batch, seed):
        rng = np.random.default_rng(seed)
        return {"tokens": rng.integers(0, 8, size=(batch, 8)), "targets": np.tile(np.arange(-1, 7), (batch, 1))}


def test_a_sweep_of_a_task_written_in_python_runs_in_this_process(tmp_path):
    qkv.register_task(Previous())
    spec = {"tasks": ["previous-sweep"], "grid": {"heads": [1, 2]}, "fixed": {"steps": 200}}
    with pytest.raises(ValueError, match="the previous-sweep task is written in Python: its runs take this process"):
        qkv.sweep(spec, str(tmp_path / "s"), jobs=2)
    table = qkv.sweep(spec, str(tmp_path / "s"))
    assert list(table["heads"]) == [1, 2] and (table["accuracy"] > 0.9).all()


def test_a_bad_sweep_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match="width"):
        qkv.sweep(dict(SPEC, grid={"width": [1]}), str(tmp_path / "s"))
    assert not (tmp_path / "s").exists()


def test_a_ctrl_c_stops_a_sweep_on_two_processes_once(tmp_path):
    # SIGINT a second into four 20,000-step runs: the workers stop, KeyboardInterrupt arrives once,
    # and nothing of it is left to interrupt what the program does next.
    import signal
    import threading
    import time
    spec = {"tasks": ["brackets"], "fixed": {"steps": 20000}, "seeds": {"start": 0, "count": 4}}
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            qkv.sweep(spec, str(tmp_path / "s"), jobs=2)
    finally:
        timer.cancel()
    time.sleep(0.5)  # a second KeyboardInterrupt would arrive here
    # And the next sweep runs.
    assert len(qkv.sweep(dict(spec, fixed={"steps": 20}), str(tmp_path / "t"), jobs=2)) == 4
