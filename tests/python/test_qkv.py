"""The Python package against the library and the qkv program: the same runs, numbers and errors."""
import json
import os
import subprocess

import numpy as np
import pytest

import qkv

QKV = os.environ.get("QKV_PROGRAM", "qkv")


@pytest.fixture(scope="module")
def rps_run(tmp_path_factory):
    """A run of rps (token readout: the payload), as qkv.train makes it."""
    out = tmp_path_factory.mktemp("runs") / "rps"
    result = qkv.train("rps", out=str(out), steps=60, seed=3)
    return out, result


@pytest.fixture(scope="module")
def line_run(tmp_path_factory):
    """A run of line (pointer readout: head 0's scores point at v + 1)."""
    out = tmp_path_factory.mktemp("runs") / "line"
    qkv.train("line", out=str(out), steps=30)
    return out


def test_train_returns_the_programs_final_object_with_the_same_numbers(rps_run, tmp_path):
    out, result = rps_run
    assert set(result) == {"task", "accuracy", "exact_match", "steps", "seconds", "loss", "out"}
    assert result["task"] == "rps" and result["steps"] == 60 and result["out"] == str(out)
    done = subprocess.run([QKV, "train", "rps", "--out", str(tmp_path / "cli"), "--steps", "60", "--seed", "3"],
                          capture_output=True, text=True, check=True)
    program = json.loads(done.stdout.strip().splitlines()[-1])
    # The same run from Python and from the program: the same numbers, to the bit.
    assert result["accuracy"] == program["accuracy"]
    assert result["loss"] == program["loss"]
    assert 0 < result["accuracy"] <= 1


def test_options_are_the_programs_and_bad_ones_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="'steps' must be a whole number from 1"):
        qkv.train("rps", out=str(tmp_path / "a"), steps=0)
    with pytest.raises(ValueError, match="'width' is not an option of qkv train"):
        qkv.train("rps", out=str(tmp_path / "b"), width=3)
    with pytest.raises(ValueError, match="unknown task 'chess'"):
        qkv.train("chess", out=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="'heads'"):
        qkv.train("rps", out=str(tmp_path / "d"), heads=3, d_model=32)
    assert "rps" in qkv.tasks() and "induction" in qkv.tasks()


def test_a_run_folder_loads_and_its_logits_are_the_caches(rps_run, line_run):
    model = qkv.load_run(str(rps_run[0]))
    assert model.cfg["readout"] == "token"
    tokens = np.array([[0, 3, 1, 5, 2, 7, 0, 4, 1, 6, 2, 8]], dtype=np.int64)
    logits = model(tokens)
    assert logits.shape == (1, 12, model.cfg["n_classes"]) and logits.dtype == np.float32
    # A list, and one sequence without its batch axis, are the same input.
    assert np.array_equal(model(tokens[0]), logits)
    assert np.array_equal(model(tokens.tolist()), logits)
    cached, cache = model.run_with_cache(tokens)
    assert np.allclose(cached, logits, atol=1e-5)  # attention op by op: the last bits may differ
    assert "blocks.0.attn.hook_pattern" in cache and "hook_embed" in cache
    assert np.allclose(cache["blocks.0.attn.hook_pattern"].sum(-1), 1, atol=1e-5)
    assert list(model.run_with_cache(tokens, names_filter="hook_embed")[1]) == ["hook_embed"]
    kept = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_z"))[1]
    assert list(kept) == ["blocks.0.attn.hook_z"]
    assert set(model.hook_names()) >= set(cache)
    # The pointer readout reads head 0's scores of the last layer: the cache's, to the last bits.
    pointer = qkv.load_run(str(line_run))
    assert pointer.cfg["readout"] == "pointer"
    values = np.array([[3, 0, 7, 1, 5, 2, 6, 4]], dtype=np.int64)
    scores = pointer(values)
    assert scores.shape == (1, 8, 8)
    assert np.allclose(pointer.run_with_cache(values)[1]["blocks.0.attn.hook_attn_scores"][:, 0], scores, atol=1e-5)


def test_run_with_cache_keeps_the_losss_gradient_at_each_point(rps_run):
    model = qkv.load_run(str(rps_run[0]))
    tokens = np.array([[0, 3, 1, 5, 2, 7, 0, 4, 1, 6, 2, 8]], dtype=np.int64)
    targets = np.full(tokens.shape, -100, dtype=np.int64)
    targets[0, [3, 7, 11]] = [1, 2, 0]
    before = model.state_dict()["head.weight"].copy()
    logits, cache = model.run_with_cache(tokens, incl_bwd=True, targets=targets)
    assert "blocks.0.attn.hook_z_grad" in cache and "hook_embed_grad" in cache
    assert all(cache[name + "_grad"].shape == cache[name].shape for name in cache if not name.endswith("_grad"))
    # At the readout's input the gradient of the mean cross-entropy is, by hand,
    # (softmax(logits) - onehot(target)) @ W_head / scored, and 0 where nothing is scored.
    weight = model.state_dict()["head.weight"].astype(np.float64)
    p = np.exp(logits[0] - logits[0].max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.zeros((tokens.shape[1], weight.shape[1]))
    for t in (3, 7, 11):
        p[t, targets[0, t]] -= 1
        want[t] = p[t] @ weight / 3
    assert np.allclose(cache["ln_final.hook_normalized_grad"][0], want, atol=1e-5)
    assert np.array_equal(model.state_dict()["head.weight"], before)  # the parameters keep theirs
    only = model.run_with_cache(tokens, names_filter="hook_embed", incl_bwd=True, targets=targets)[1]
    assert sorted(only) == ["hook_embed", "hook_embed_grad"]
    with pytest.raises(ValueError, match="incl_bwd=True needs targets"):
        model.run_with_cache(tokens, incl_bwd=True)


def test_arrays_share_qkvs_memory_and_come_back_without_a_copy(rps_run):
    out, _ = rps_run
    model = qkv.load_run(str(out))
    first, second = model.state_dict(), model.state_dict()
    for name, value in first.items():
        # The same storage each time: the model's own, not a copy.
        assert value.__array_interface__["data"][0] == second[name].__array_interface__["data"][0]
        assert not value.flags.writeable
    tokens = np.arange(12, dtype=np.int64).reshape(1, 12) % 9
    seen = {}

    def keep(activation, hook):
        seen[hook.name] = activation
        return activation  # the array qkv gave: the same tensor goes on

    def same(activation, hook):
        # The replacement from the first hook arrives as that tensor, at the same address.
        assert activation.__array_interface__["data"][0] == seen[hook.name].__array_interface__["data"][0]

    model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", keep), ("blocks.0.attn.hook_z", same)])
    assert seen["blocks.0.attn.hook_z"].dtype == np.float32
    # A view of qkv's array at the same address and shape but in another order (the pattern
    # transposed) is that view's values, as a copy would be, not the array it views.
    swapped = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda p, hook: np.swapaxes(p, -1, -2))])
    copied = model.run_with_hooks(
        tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda p, hook: np.ascontiguousarray(np.swapaxes(p, -1, -2)))])
    assert np.array_equal(swapped, copied)
    assert not np.array_equal(swapped, model.run_with_hooks(tokens, fwd_hooks=[]))


def test_a_hook_that_replaces_an_activation_changes_the_logits_as_the_library_does(line_run):
    model = qkv.load_run(str(line_run))
    tokens = np.array([[3, 0, 7, 1, 5, 2, 6, 4]], dtype=np.int64)
    plain = model(tokens)
    assert np.any(plain != 0)
    # Queries zeroed: every score q·k is 0, and the pointer readout reads the scores.
    zeroed = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_q", lambda q, hook: np.zeros_like(q))])
    assert np.all(zeroed == 0)
    # A hook that returns None leaves the activation as it was.
    unchanged = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_q", lambda q, hook: None)])
    assert np.array_equal(unchanged, model.run_with_hooks(tokens, fwd_hooks=[]))
    with pytest.raises(ValueError, match="blocks.0.attn.hook_q"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_q", lambda q, hook: np.zeros((2, 2), np.float32))])
    with pytest.raises(ValueError, match="int64"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_q", lambda q, hook: np.zeros(q.shape, np.int64))])


def test_errors_name_the_file_or_the_argument(tmp_path, rps_run):
    with pytest.raises(OSError, match=str(tmp_path / "nothing")):
        qkv.load_run(str(tmp_path / "nothing"))
    model = qkv.load_run(str(rps_run[0]))
    with pytest.raises(ValueError, match="index 99 .* out of range for a table of 24 rows"):
        model(np.array([[99]], dtype=np.int64))
    with pytest.raises(ValueError, match="tokens"):
        model(np.zeros((1, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="hook_nothing"):
        model.run_with_cache(np.array([[0, 1]]), names_filter=["hook_nothing"])


def test_per_head_matrices_are_the_ones_the_model_multiplies_by(rps_run):
    model = qkv.load_run(str(rps_run[0]))
    cfg = model.cfg
    L, H = cfg["layers"], cfg["heads"]
    d_head = cfg["d_head"] or cfg["d_model"] // H
    assert model.W_Q.shape == (L, H, cfg["d_model"], d_head)
    assert model.W_K.shape == (L, H, cfg["d_model"], d_head)
    assert model.W_O.shape[:2] == (L, H) and model.W_O.shape[-1] == cfg["d_model"]
    tokens = np.array([[0, 3, 1, 5, 2, 7, 0, 4, 1, 6, 2, 8]], dtype=np.int64)
    _, cache = model.run_with_cache(tokens)
    # q of head h = ln1(x) · W_Q[0, h] + its bias: the cache's, from the matrices by hand.
    normalized = cache["blocks.0.ln1.hook_normalized"]
    bias = model.state_dict()["blocks.0.attn.q_proj.bias"]
    for h in range(H):
        q = normalized @ model.W_Q[0, h] + bias[h * d_head:(h + 1) * d_head]
        assert np.allclose(q, cache["blocks.0.attn.hook_q"][:, :, h], atol=1e-5)


def test_a_new_model_takes_a_run_s_state_and_then_its_logits(rps_run):
    trained = qkv.load_run(str(rps_run[0]))
    fresh = qkv.Transformer(trained.cfg, seed=11)
    tokens = np.array([[0, 3, 1, 5, 2, 7]], dtype=np.int64)
    assert not np.array_equal(fresh(tokens), trained(tokens))
    fresh.load_state_dict(trained.state_dict())
    assert np.array_equal(fresh(tokens), trained(tokens))
    state = trained.state_dict()
    state.pop("tok.weight")
    with pytest.raises(ValueError, match="tok.weight"):
        fresh.load_state_dict(state)
    with pytest.raises(ValueError, match="d_model"):
        qkv.Transformer({"vocab_size": 8, "max_len": 4, "d_model": 0})


def test_generate_is_greedy_decoding_by_hand():
    model = qkv.Transformer({"vocab_size": 10, "n_classes": 10, "d_model": 16, "heads": 2, "layers": 2,
                             "max_len": 12, "readout": "token"}, seed=5)
    prompt = np.array([[1, 2, 3], [4, 4, 0]], dtype=np.int64)
    out = model.generate(prompt, 6)
    assert out.shape == (2, 9) and out.dtype == np.int64
    assert np.array_equal(out[:, :3], prompt)
    seq = prompt
    for _ in range(6):  # the argmax of the last position's logits, appended
        seq = np.concatenate([seq, model(seq)[:, -1].argmax(-1)[:, None]], axis=1)
    assert np.array_equal(out, seq)
    assert np.array_equal(model.generate(prompt, 6, use_cache=False), out)
    sampled = model.generate(prompt, 6, temperature=1.0, seed=3)
    assert np.array_equal(sampled, model.generate(prompt, 6, temperature=1.0, seed=3))
    with pytest.raises(ValueError, match="3 prompt tokens and 10 more pass the model's 12 positions"):
        model.generate(prompt, 10)


def program_json(*args):
    done = subprocess.run([QKV, *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_inspect_evaluate_and_ablate_are_the_programs(rps_run):
    out = str(rps_run[0])
    inspection = qkv.inspect(out)
    assert inspection == program_json("inspect", out, "--json")
    assert qkv.evaluate(out, n=256, seed=4) == program_json("eval", out, "--n", "256", "--seed", "4")
    assert qkv.ablate(out, n=64) == program_json("ablate", out, "--n", "64", "--json")
    # σ of the head, from W_Q and W_K in numpy: the inspection's.
    model = qkv.load_run(out)
    A = model.W_Q[0, 0].astype(np.float64) @ model.W_K[0, 0].astype(np.float64).T
    sigma = np.sum(((A + A.T) / 2) ** 2) / np.sum(A ** 2)
    assert abs(inspection["layers"][0]["heads"][0]["sigma"] - sigma) < 1e-6
    assert np.allclose(qkv.qk_circuit(model, 0, 0), A, atol=1e-6)
    assert abs(qkv.symmetric_share(qkv.qk_circuit(model, 0, 0)) - sigma) < 1e-6
    page = qkv.report_html(out)
    assert page.startswith("<!DOCTYPE html>") and "L0H0" in page
    with pytest.raises(IndexError, match="layer 1: the model has 1 layers"):
        qkv.qk_circuit(model, 1, 0)


def test_composition_scores_are_the_frameworks_formula():
    model = qkv.Transformer({"vocab_size": 10, "n_classes": 10, "d_model": 16, "heads": 2, "layers": 2,
                             "max_len": 12, "readout": "token"}, seed=2)
    ov, qk = qkv.ov_circuit(model, 0, 1), qkv.qk_circuit(model, 1, 0)
    norm = np.linalg.norm
    assert abs(qkv.composition_score(model, 0, 1, 1, 0, "q") - norm(ov @ qk) / (norm(ov) * norm(qk))) < 1e-12
    assert abs(qkv.composition_score(model, 0, 1, 1, 0, "k") - norm(ov @ qk.T) / (norm(ov) * norm(qk))) < 1e-12
    reader_ov = qkv.ov_circuit(model, 1, 0)
    assert abs(qkv.composition_score(model, 0, 1, 1, 0, "v") - norm(ov @ reader_ov) / (norm(ov) * norm(reader_ov))) < 1e-12
    with pytest.raises(ValueError, match="layer 1 does not come before layer 1"):
        qkv.composition_score(model, 1, 0, 1, 1, "q")


def test_head_detectors_are_transformer_lens_patterns_on_the_cached_attention():
    model = qkv.Transformer({"vocab_size": 10, "n_classes": 10, "d_model": 16, "heads": 2, "layers": 2,
                             "max_len": 12, "readout": "token"}, seed=4)
    sequences = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 2, 7, 2]]

    def patterns(tokens):  # TransformerLens's detection patterns, written as head_detector writes them
        t = np.array(tokens)
        previous = np.tril(np.eye(len(t), k=-1))
        duplicate = np.equal(t[None, :], t[:, None]).astype(float)
        np.fill_diagonal(duplicate, 0)
        duplicate = np.tril(duplicate)
        induction = np.roll(duplicate, 1, axis=1)
        induction[:, 0] = 0
        return {"previous_token": previous, "duplicate_token": duplicate, "induction": np.tril(induction)}

    found = qkv.detect_heads(model, sequences)
    for kind in ("previous_token", "duplicate_token", "induction"):
        assert found[kind].shape == (2, 2)
        expected = np.zeros((2, 2))
        for tokens in sequences:
            cache = model.run_with_cache(np.array([tokens]))[1]
            for layer in range(2):
                weights = cache[f"blocks.{layer}.attn.hook_pattern"][0].astype(np.float64)  # (heads, T, T)
                expected[layer] += (weights * patterns(tokens)[kind]).sum(axis=(1, 2)) / weights.sum(axis=(1, 2)) / 2
        assert np.allclose(found[kind], expected, atol=1e-6), kind
    with pytest.raises(ValueError, match="sequence 0 holds 1 tokens"):
        qkv.detect_heads(model, [[3]])


def test_patch_is_the_programs_patching(tmp_path):
    out = str(tmp_path / "induction")
    qkv.train("induction", out=out, steps=200)
    patched = qkv.patch(out, "v", by_position=True, n=16, seed=2)
    assert patched == program_json("patch", out, "--component", "v", "--by-position", "--n", "16", "--seed", "2", "--json")
    assert patched["length"] == len(patched["positions"]) == len(patched["layers"][0]["heads"][0]["patched"])
    with pytest.raises(ValueError, match="no component 'values'"):
        qkv.patch(out, "values")
    paths = qkv.path_patch(out, noising=True, n=16)
    assert paths == program_json("patch", out, "--path", "--noising", "--n", "16", "--json")
    assert [p["input"] for p in paths["paths"]] == ["logits", "q", "k", "v", "logits"]
    kept = str(tmp_path / "kept")
    qkv.train("induction", out=kept, steps=60, keep_checkpoints="every:25")
    across = qkv.across_training(kept)
    assert across == program_json("inspect", kept, "--across-training", "--json")
    assert [c["step"] for c in across["checkpoints"]] == [0, 25, 50, 60]
    attribution = qkv.logit_attribution(out, n=16)
    assert attribution == program_json("attribute", out, "--n", "16", "--json")
    assert abs(attribution["total"] - attribution["logit_diff"]) < 1e-4


def test_a_built_in_task_samples_what_it_asks():
    line = qkv.task("line")
    assert (line.name, line.readout, line.vocab_size, line.max_len) == ("line", "pointer", 8, 8)
    batch = line.sample(16, seed=7)
    tokens, targets = batch["tokens"], batch["targets"]
    assert tokens.shape == targets.shape == (16, 8) and tokens.dtype == np.int64
    # Each value points at the position of the next one; the last value (7) points nowhere.
    for row, target in zip(tokens, targets):
        for i, t in enumerate(target):
            if row[i] == 7:
                assert t == -100
            else:
                assert row[t] == row[i] + 1
    assert np.array_equal(line.sample(16, seed=7)["tokens"], tokens)  # the seed's batch, again
    assert qkv.task("cycle", n=3).vocab_size == 3
    rps = qkv.task("rps")
    assert rps.readout == "token" and rps.encode(rps.decode(list(rps.sample(1, 0)["tokens"][0])))
    with pytest.raises(ValueError, match="unknown task 'chess'"):
        qkv.task("chess")


@pytest.fixture(scope="module")
def reverse_run(tmp_path_factory):
    """A run of reverse: an encoder-decoder."""
    out = tmp_path_factory.mktemp("runs") / "reverse"
    qkv.train("reverse", out=str(out), steps=300)
    return out


def test_a_seq2seq_run_loads_as_an_encoder_decoder_that_writes_what_the_program_writes(reverse_run):
    model = qkv.load_run(str(reverse_run))
    assert isinstance(model, qkv.EncoderDecoder)
    assert model.cfg["encoder_layers"] == 2 and model.cfg["src_vocab"] == 11
    task = qkv.task("reverse")
    sides = task.seq2seq
    assert sides == {"source_vocab": 11, "max_source_len": 12, "source_pad": 10, "start": 10, "end": 11}
    assert qkv.task("rps").seq2seq is None
    for text in ["3 1 4", "0 5 2 6 7 8 8 5 6 2 9"]:
        source = np.array([task.encode(text)])
        written = model.generate(source, source.shape[1] + 1, sides["start"])
        assert np.array_equal(written, model.generate(source, source.shape[1] + 1, sides["start"], use_cache=False))
        row = list(written[0])
        done = subprocess.run([QKV, "generate", str(reverse_run), "--input", text], capture_output=True, text=True,
                              check=True)
        assert task.decode(row[:row.index(sides["end"])] if sides["end"] in row else row) == done.stdout.strip()
        # Greedy decoding by hand: each token the argmax of the logits of the tokens before it.
        tokens = [sides["start"]]
        for _ in range(source.shape[1] + 1):
            tokens.append(int(model(source, [tokens])[0, -1].argmax()))
        assert tokens[1:] == row


def test_an_encoder_decoder_caches_and_hooks_by_name_and_takes_a_padding_mask(reverse_run):
    model = qkv.load_run(str(reverse_run))
    task = qkv.task("reverse")
    batch = task.sample(8, 4)
    padding = batch["source"] != task.seq2seq["source_pad"]
    assert not padding.all()  # the batch has shorter sources
    logits = model(batch["source"], batch["tokens"], source_padding=padding)
    (_, S), (_, T) = batch["source"].shape, batch["tokens"].shape
    assert logits.shape == (8, T, 12)
    # The trainer's loss masks padding: with the mask, accuracy on the scored positions is the run's.
    scored = batch["targets"] != -100
    right = (logits.argmax(-1) == batch["targets"])[scored].mean()
    unmasked = (model(batch["source"], batch["tokens"]).argmax(-1) == batch["targets"])[scored].mean()
    assert right > 0.85 and right >= unmasked
    again, cache = model.run_with_cache(batch["source"], batch["tokens"], names_filter=lambda n: "cross_attn.hook_pattern" in n,
                                        source_padding=padding)
    assert np.allclose(again, logits, atol=1e-5)  # attention op by op: the last bits may differ
    pattern = cache["decoder.blocks.0.cross_attn.hook_pattern"]
    assert pattern.shape == (8, 2, T, S)
    assert np.allclose(pattern.sum(-1), 1, atol=1e-5)
    assert (pattern[np.broadcast_to(~padding[:, None, None, :], pattern.shape)] == 0).all()  # none attends padding
    assert pattern[np.broadcast_to(padding[:, None, None, :], pattern.shape)].max() > 0.5
    assert model.encode(batch["source"], padding).shape == (8, S, 64)
    zeroed = model.run_with_hooks(batch["source"], batch["tokens"],
                                  fwd_hooks=[("decoder.blocks.0.cross_attn.hook_z", lambda z, hook: z * 0)],
                                  source_padding=padding)
    # Without the source, the decoder cannot reverse it.
    assert (zeroed.argmax(-1) == batch["targets"])[scored].mean() < 0.5
    with pytest.raises(ValueError, match="decoder.blocks.0.cross_attn.hook_zz"):
        model.run_with_hooks(batch["source"], batch["tokens"], fwd_hooks=[("decoder.blocks.0.cross_attn.hook_zz", print)])
    # A new model takes the run's state, and then its logits.
    fresh = qkv.EncoderDecoder(model.cfg, seed=9)
    assert not np.array_equal(fresh(batch["source"], batch["tokens"]), model(batch["source"], batch["tokens"]))
    fresh.load_state_dict(model.state_dict())
    assert np.array_equal(fresh(batch["source"], batch["tokens"], padding), logits)
    with pytest.raises(ValueError, match="source_padding"):
        model(batch["source"], batch["tokens"], source_padding=np.ones(3, dtype=bool))


def test_spectra_and_asymmetries_are_numpys():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 6))
    sp = qkv.spectrum(a)
    s = np.linalg.svd(a, compute_uv=False)
    assert np.allclose(sp["singular_values"], s, rtol=1e-12)
    assert np.isclose(sp["stable_rank"], (s ** 2).sum() / s[0] ** 2, rtol=1e-12) and sp["rank"] == 6
    theirs = np.linalg.eigvals(a)
    assert np.allclose(np.sort(np.abs(sp["eigenvalues"]))[::-1], np.abs(sp["eigenvalues"]))  # by modulus
    assert np.allclose(np.sort_complex(sp["eigenvalues"]), np.sort_complex(theirs), atol=1e-10)
    low = rng.standard_normal((6, 2)) @ rng.standard_normal((2, 4))
    assert qkv.spectrum(low)["rank"] == 2 and len(qkv.spectrum(low)["eigenvalues"]) == 0
    sigma = qkv.symmetric_share(a)
    assert np.isclose(qkv.antisymmetry(a), np.linalg.norm(a - a.T) / np.linalg.norm(a), rtol=1e-12)
    assert np.isclose(qkv.antisymmetry(a), 2 * np.sqrt(1 - sigma), rtol=1e-12)

    # What softmax sees of S − Sᵀ: min over c of ‖S − Sᵀ + c1ᵀ − 1cᵀ‖ off the diagonal, by least squares.
    T = 6
    off = ~np.eye(T, dtype=bool)
    pairs = [(i, j) for i in range(T) for j in range(T) if off[i, j]]
    design = np.zeros((len(pairs), T))
    for row, (i, j) in enumerate(pairs):
        design[row, i], design[row, j] = 1, -1
    flow = np.array([a[i, j] - a[j, i] for i, j in pairs])
    c = np.linalg.lstsq(design, -flow, rcond=None)[0]
    centred = a - a.mean(1, keepdims=True)
    expected = np.linalg.norm(flow + design @ c) / np.linalg.norm(centred[off])
    assert np.isclose(qkv.score_asymmetry(a), expected, rtol=1e-10)
    symmetric = a + a.T + rng.standard_normal((T, 1))  # a constant added to each query's row
    assert qkv.score_asymmetry(symmetric) < 1e-12
    assert qkv.score_asymmetry(a, np.tril(np.ones((T, T), dtype=bool))) is None  # causal: no pair both ways


def test_a_token_table_is_the_scores_of_the_embeddings_by_hand(rps_run):
    model = qkv.load_run(str(rps_run[0]))
    p = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    e = p["tok.weight"]
    h = (e - e.mean(1, keepdims=True)) / np.sqrt(e.var(1, keepdims=True) + 1e-5)
    h = h * p["blocks.0.ln1.weight"] + p["blocks.0.ln1.bias"]
    q = h @ p["blocks.0.attn.q_proj.weight"].T + p["blocks.0.attn.q_proj.bias"]
    k = h @ p["blocks.0.attn.k_proj.weight"].T + p["blocks.0.attn.k_proj.bias"]
    H = model.cfg["heads"]
    d = q.shape[1] // H
    table = qkv.token_table(model, 0)
    assert table.shape == (H, e.shape[0], e.shape[0])
    for head in range(H):
        by_hand = q[:, head * d:(head + 1) * d] @ k[:, head * d:(head + 1) * d].T / np.sqrt(d)
        assert np.allclose(table[head], by_hand, atol=1e-4)
    assert qkv.position_table(model, 0).shape == (H, model.cfg["max_len"], model.cfg["max_len"])
    with pytest.raises(IndexError, match="layer 5: the model has"):
        qkv.token_table(model, 5)


def test_score_asymmetry_counts_the_finite_scores_by_default():
    rng = np.random.default_rng(9)
    s = rng.standard_normal((5, 5))
    padded = s.copy()
    padded[:, 2] = -np.inf  # key 2 is padding: no query sees it
    kept = np.delete(np.delete(s, 2, 0), 2, 1)
    assert np.isclose(qkv.score_asymmetry(padded), qkv.score_asymmetry(kept), rtol=1e-12)
