"""qkv.to_torch: a torch.nn.Module whose logits are qkv's, for every option of the models."""
import numpy as np
import pytest

import qkv

torch = pytest.importorskip("torch")  # the only tests that import it: where torch is absent, they skip

BASE = {"vocab_size": 7, "n_classes": 5, "max_len": 9, "layers": 2, "d_model": 16, "heads": 2}
CONFIGS = {
    "token": {},
    "pointer": {"readout": "pointer", "n_classes": 0},
    "tied": {"qk": "tied"},
    "symmetric, d_head 3": {"qk": "symmetric", "d_head": 3},
    "identity, pointer": {"proj": "identity", "readout": "pointer", "n_classes": 0},
    "identity-qk, symmetric": {"proj": "identity-qk", "qk": "symmetric"},
    "frozen projections and embeddings": {"proj": "frozen", "embeddings": "frozen"},
    "gqa with an mlp": {"heads": 4, "kv_heads": 2, "mlp": True},
    "mqa, unscaled, sinusoids": {"heads": 4, "kv_heads": 1, "scale": False, "positions": "sinusoidal"},
    "bidirectional then causal": {"causal_layers": [False, True], "mlp": True},
    # Nanda et al.'s modular-addition model, as modadd builds it.
    "relu mlp 24 wide, no layernorm, no attention biases, normal init": {
        "mlp": True, "d_mlp": 24, "activation": "relu", "layer_norm": False, "attention_bias": False, "init": "normal"},
}


def agree(ours, theirs):
    """Equal within float32 rounding, with -inf (a masked score) at the same places."""
    theirs = theirs.detach().numpy()
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    masked = np.isinf(ours)
    assert np.array_equal(masked, np.isinf(theirs))
    assert np.allclose(ours[~masked], theirs[~masked], rtol=1e-5, atol=1e-5 * max(1.0, np.abs(ours[~masked]).max()))


@pytest.mark.parametrize("name", CONFIGS)
def test_the_module_of_every_option_gives_qkvs_logits(name):
    model = qkv.Transformer(dict(BASE, **CONFIGS[name]), seed=3)
    module = qkv.to_torch(model)
    assert set(module.state_dict()) == set(model.state_dict())
    tokens = np.random.default_rng(0).integers(0, 7, size=(3, 9))
    agree(model(tokens), module(torch.tensor(tokens)))
    agree(model(tokens[:, :4]), module(torch.tensor(tokens[:, :4])))
    # Its own copies: a step in torch leaves qkv's model as it was.
    before = model(tokens)
    trainable = [p for p in module.parameters() if p.requires_grad]
    out = module(torch.tensor(tokens))
    out[torch.isfinite(out)].sum().backward()
    # The pointer readout reads the last layer's scores: what comes after them gets no gradient.
    unread = sorted(n for n, p in module.named_parameters() if p.requires_grad and p.grad is None)
    last = "blocks.1."
    assert unread == ([] if model.cfg["readout"] == "token" else sorted(
        n for n in model.state_dict() if n.startswith(("ln_final.", last + "attn.v_proj.", last + "attn.out_proj."))))
    assert all(torch.isfinite(p.grad).all() for p in trainable if p.grad is not None)
    with torch.no_grad():
        for p in trainable:
            if p.grad is not None:
                p -= 0.1 * p.grad
    assert np.array_equal(model(tokens), before)


def test_what_qkv_freezes_torch_does_not_train():
    module = qkv.to_torch(qkv.Transformer(dict(BASE, proj="frozen", embeddings="frozen", mlp=True)))
    frozen = sorted(n for n, p in module.named_parameters() if not p.requires_grad)
    assert frozen == sorted(n for n in module.state_dict()
                            if n.startswith(("tok.", "pos.", "ln_final.")) or ".ln1." in n or ".ln2." in n
                            or ".q_proj." in n or ".k_proj." in n or ".v_proj." in n)
    free = sorted(n for n, p in module.named_parameters() if p.requires_grad)
    assert "blocks.0.attn.out_proj.weight" in free and "blocks.1.mlp.fc.weight" in free and "head.weight" in free


def test_a_trained_run_continues_in_torch_with_its_accuracy(tmp_path):
    qkv.train("rps", out=str(tmp_path / "rps"), steps=300)
    model = qkv.load_run(str(tmp_path / "rps"))
    module = qkv.to_torch(model)
    batch = qkv.task("rps").sample(64, 11)
    logits = module(torch.tensor(batch["tokens"]))
    agree(model(batch["tokens"]), logits)
    scored = batch["targets"] != -100
    ours = (model(batch["tokens"]).argmax(-1) == batch["targets"])[scored].mean()
    theirs = (logits.argmax(-1).numpy() == batch["targets"])[scored].mean()
    assert ours == theirs and ours > 0.5
    # Trains on: Adam steps on the task's batches lower the loss it had.
    adam = torch.optim.Adam(module.parameters(), lr=1e-3)
    loss = torch.nn.functional.cross_entropy

    def batch_loss(seed):
        b = qkv.task("rps").sample(64, seed)
        out = module(torch.tensor(b["tokens"]))
        return loss(out.reshape(-1, out.shape[-1]), torch.tensor(b["targets"]).reshape(-1), ignore_index=-100)

    with torch.no_grad():
        before = np.mean([batch_loss(1000 + s).item() for s in range(4)])
    for step in range(100):
        adam.zero_grad()
        batch_loss(step).backward()
        adam.step()
    with torch.no_grad():
        after = np.mean([batch_loss(1000 + s).item() for s in range(4)])
    assert after < before


def test_an_encoder_decoder_becomes_a_module_with_its_logits(tmp_path):
    qkv.train("reverse", out=str(tmp_path / "reverse"), steps=40)
    model = qkv.load_run(str(tmp_path / "reverse"))
    module = qkv.to_torch(model)
    assert set(module.state_dict()) == set(model.state_dict())
    task = qkv.task("reverse")
    batch = task.sample(6, 2)
    padding = batch["source"] != task.seq2seq["source_pad"]
    agree(model(batch["source"], batch["tokens"], padding),
          module(batch["source"], batch["tokens"], torch.tensor(padding)))
    agree(model(batch["source"], batch["tokens"]), module(batch["source"], batch["tokens"]))
    for options in ({"qk": "tied", "mlp": True, "positions": "sinusoidal"}, {"qk": "symmetric", "proj": "identity"}):
        fresh = qkv.EncoderDecoder(dict(model.cfg, **options), seed=4)
        agree(fresh(batch["source"], batch["tokens"], padding),
              qkv.to_torch(fresh)(batch["source"], batch["tokens"], torch.tensor(padding)))


def test_to_torch_takes_qkv_models_only():
    with pytest.raises(TypeError, match="to_torch: a qkv.Transformer or qkv.EncoderDecoder, not dict"):
        qkv.to_torch({})


def test_a_source_all_padding_gives_zeros_and_finite_gradients_in_both(tmp_path):
    model = qkv.EncoderDecoder({"src_vocab": 5, "tgt_vocab": 6, "max_src_len": 4, "max_tgt_len": 3}, seed=1)
    module = qkv.to_torch(model)
    source, tokens = np.array([[1, 2, 3, 4], [1, 1, 1, 1]]), np.array([[0, 1, 2], [0, 1, 2]])
    padding = np.array([[True, True, False, True], [False, False, False, False]])  # the second row: none attended
    out = module(source, tokens, padding)
    agree(model(source, tokens, padding), out)
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


