"""modadd from Python: the paper's model (no LayerNorm, ReLU MLP, no attention biases) against a forward
written here in numpy from its state_dict, and the held-out metrics training logs."""
import json
import os
import subprocess

import numpy as np
import pytest

import qkv


def numpy_forward(state, tokens, heads):
    """Nanda et al.'s one-layer model in float64, from the run's weights: embeddings, causal attention without
    biases or LayerNorm, x + W_out relu(W_in x + b_in) + b_out, then the head."""
    w = {name: np.asarray(value, dtype=np.float64) for name, value in state.items()}
    x = w["tok.weight"][tokens] + w["pos.weight"][: tokens.shape[1]]
    B, T, D = x.shape
    d = D // heads
    split = lambda m: m.reshape(B, T, heads, d).transpose(0, 2, 1, 3)  # (B, H, T, d)
    q = split(x @ w["blocks.0.attn.q_proj.weight"].T)
    k = split(x @ w["blocks.0.attn.k_proj.weight"].T)
    v = split(x @ w["blocks.0.attn.v_proj.weight"].T)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    pattern = np.exp(scores - scores.max(-1, keepdims=True))
    pattern /= pattern.sum(-1, keepdims=True)
    z = (pattern @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
    x = x + z @ w["blocks.0.attn.out_proj.weight"].T
    hidden = np.maximum(x @ w["blocks.0.mlp.fc.weight"].T + w["blocks.0.mlp.fc.bias"], 0)
    x = x + hidden @ w["blocks.0.mlp.proj.weight"].T + w["blocks.0.mlp.proj.bias"]
    return x @ w["head.weight"].T + w["head.bias"]


def test_modadd_logits_are_a_numpy_forward_of_its_weights(tmp_path):
    out = tmp_path / "modadd"
    result = qkv.train("modadd", out=str(out), p=13, steps=30, d_model=16, heads=2, d_mlp=32, log_every=10,
                       keep_checkpoints="every:10")
    assert result["task"] == "modadd" and result["steps"] == 30
    model = qkv.load_run(str(out))
    state = model.state_dict()
    assert not any("ln" in name for name in state)
    assert not any(name.startswith("blocks.0.attn") and name.endswith("bias") for name in state)
    tokens = np.array([[a, b, 13] for a in range(13) for b in range(13)], dtype=np.int64)
    expected = numpy_forward(state, tokens, heads=2)
    assert np.abs(model(tokens) - expected).max() < 1e-4 * max(1.0, np.abs(expected).max())
    # The held-out accuracy logged at the last step is that of the final model on the pairs not trained on.
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [10, 20, 30]
    config = json.loads((out / "config.json").read_text())
    assert config["train_fraction"] == 0.3 and config["batch"] == 0
    evaluated = qkv.evaluate(str(out))
    assert lines[-1]["test_accuracy"] == evaluated["accuracy"]
    assert evaluated["sequences"] == 169 - 50  # floor(0.3 * 169) = 50 train
    right = (expected[:, -1].argmax(-1) == (tokens[:, 0] + tokens[:, 1]) % 13).sum()
    counted = round(evaluated["train"]["accuracy"] * 50) + round(evaluated["accuracy"] * 119)
    assert abs(counted - right) <= 1  # float32 against float64: a near tie may go the other way

    # The Fourier analysis is the program's: the same JSON, and its embedding norms are those of the
    # weights in numpy's own Fourier basis.
    fourier = qkv.fourier(str(out))
    done = subprocess.run([os.environ.get("QKV_PROGRAM", "qkv"), "inspect", str(out), "--fourier", "--json"],
                          capture_output=True, text=True, check=True)
    program = json.loads(done.stdout)
    assert fourier == program
    assert [row["step"] for row in fourier["along"]] == [0, 10, 20, 30]
    x = np.arange(13)
    W = np.asarray(state["tok.weight"], dtype=np.float64)[:13]
    for k in (1, 4):
        c, s_ = np.cos(2 * np.pi * k * x / 13), np.sin(2 * np.pi * k * x / 13)
        norm = np.sqrt(((c / np.linalg.norm(c)) @ W) @ ((c / np.linalg.norm(c)) @ W)
                       + ((s_ / np.linalg.norm(s_)) @ W) @ ((s_ / np.linalg.norm(s_)) @ W))
        assert abs(fourier["final"]["embed"][k] - norm) < 1e-5 * norm


def test_a_tasks_split_is_the_one_the_run_of_its_seed_trains_on(tmp_path):
    out = tmp_path / "run"
    qkv.train("modadd", out=str(out), p=11, seed=5, steps=20, d_model=16, heads=2, d_mlp=32, log_every=10)
    split = qkv.task("modadd", n=11, seed=5).split
    pairs = lambda side: {(a, b) for a, b, _ in split[side]["tokens"].tolist()}
    train, test = pairs("train"), pairs("test")
    assert len(train) == 36 and len(test) == 121 - 36 and not train & test  # floor(0.3 · 121) = 36 train
    assert train | test == {(a, b) for a in range(11) for b in range(11)}
    for side in ("train", "test"):
        tokens, targets = split[side]["tokens"], split[side]["targets"]
        assert (tokens[:, 2] == 11).all() and (targets[:, -1] == (tokens[:, 0] + tokens[:, 1]) % 11).all()
    other = qkv.task("modadd", n=11, seed=6).split["train"]["tokens"]
    assert {(a, b) for a, b, _ in other.tolist()} != train
    assert len(qkv.task("modadd", n=11, seed=5, train_fraction=0.5).split["train"]["tokens"]) == 60
    # The run's own scores on the two splits are the model's on these rows.
    model = qkv.load_run(str(out))
    evaluated = qkv.evaluate(str(out))
    for side, scores in (("train", evaluated["train"]), ("test", evaluated)):
        tokens, targets = split[side]["tokens"], split[side]["targets"]
        right = (model(tokens)[:, -1].argmax(-1) == targets[:, -1]).sum()
        assert abs(right - scores["accuracy"] * len(tokens)) <= 1  # a near tie may go the other way in float32
    assert qkv.task("brackets").split is None
    with pytest.raises(ValueError, match="train_fraction is for a data set's split"):
        qkv.task("brackets", train_fraction=0.5)
