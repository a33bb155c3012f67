"""qkv's models as torch.nn.Modules: qkv.to_torch(model). Imported only when called (it needs torch).

The modules are written from the architecture qkv's headers describe (nn/transformer.hpp,
nn/attention.hpp, nn/seq2seq.hpp), with torch's own layers, and hold the model's parameters under
the same names, so that `module.state_dict()` is `model.state_dict()` as torch tensors and a
module's logits equal qkv's within float32 rounding (tests/python/test_torch_export.py).
"""
import math

import numpy as np
import torch
import torch.nn.functional as F

from . import _qkv


def sinusoids(length, d_model):
    """P[t, 2i] = sin(t / 10000^(2i/D)), P[t, 2i+1] = cos(t / 10000^(2i/D)), in float64."""
    t = np.arange(length, dtype=np.float64)[:, None]
    i = np.arange(d_model)
    angle = t / np.power(10000.0, (i - i % 2) / d_model)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle))


class Attention(torch.nn.Module):
    """Multi-head attention as qkv's MultiHeadAttention computes it: q, k and v projections (k is
    q's for tied and symmetric heads, where symmetric keys are q ⊙ s, s = +1 on the first half of
    each head's dimensions and −1 on the rest; none of the three for identity heads), GQA/MQA by
    kv heads shared among groups of query heads (identity-qk: q and k are the stream, v learned), scores scaled by 1/√d_head unless `scale` is off,
    then softmax and out_proj; the projections have biases unless `bias` is off."""

    def __init__(self, d_model, heads, d_head, kv_heads, qk, proj, scale, bias=True):
        super().__init__()
        self.heads, self.kv_heads, self.d_head, self.qk, self.proj = heads, kv_heads, d_head, qk, proj
        self.scale = 1 / math.sqrt(d_head) if scale else 1.0
        if proj not in ("identity", "identity-qk"):
            self.q_proj = torch.nn.Linear(d_model, heads * d_head, bias=bias)
            if qk == "untied":
                self.k_proj = torch.nn.Linear(d_model, kv_heads * d_head, bias=bias)
        if proj != "identity":
            self.v_proj = torch.nn.Linear(d_model, kv_heads * d_head, bias=bias)
            if proj == "frozen":
                for layer in (self.q_proj, getattr(self, "k_proj", None), self.v_proj):
                    if layer is not None:
                        layer.requires_grad_(False)
        self.out_proj = torch.nn.Linear(heads * d_head, d_model, bias=bias)
        signs = [1.0 if i % d_head < (d_head + 1) // 2 else -1.0 for i in range(heads * d_head)]
        self.register_buffer("signs", torch.tensor(signs), persistent=False)

    def forward(self, query, memory, causal, key_padding=None):
        """query (B, Tq, D) attends memory (B, Tk, D); key_padding (B, Tk), False at padding."""
        if self.proj in ("identity", "identity-qk"):
            q, k = query, memory
            v = memory if self.proj == "identity" else self.v_proj(memory)
        else:
            q = self.q_proj(query)
            k = (self.k_proj if self.qk == "untied" else self.q_proj)(memory)
            v = self.v_proj(memory)
        if self.qk == "symmetric":
            k = k * self.signs.to(k.dtype)
        B, Tq, Tk = query.shape[0], query.shape[1], memory.shape[1]
        q = q.reshape(B, Tq, self.heads, -1).transpose(1, 2)
        group = self.heads // self.kv_heads
        k = k.reshape(B, Tk, self.kv_heads, -1).transpose(1, 2).repeat_interleave(group, 1)
        v = v.reshape(B, Tk, self.kv_heads, -1).transpose(1, 2).repeat_interleave(group, 1)
        scores = q @ k.transpose(-1, -2) * self.scale  # (B, H, Tq, Tk)
        if causal:
            scores = scores.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        if key_padding is not None:
            scores = scores.masked_fill(~key_padding[:, None, None, :], float("-inf"))
        # A query with no key to attend (every key padding) gets zeros, forward and backward, as in qkv.
        dead = torch.isneginf(scores).all(-1, keepdim=True)
        pattern = torch.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
        z = (pattern @ v).transpose(1, 2).reshape(B, Tq, -1)
        return self.out_proj(z), scores


def norm(d_model, layer_norm=True):
    """A LayerNorm, or without LayerNorm (layer_norm false) the identity, which has no parameters."""
    return torch.nn.LayerNorm(d_model, eps=1e-5) if layer_norm else torch.nn.Identity()


class Block(torch.nn.Module):
    """A pre-LayerNorm block: x + attn(ln1(x)), then (decoder blocks) y + cross_attn(ln_cross(y),
    memory), then with the MLP x + proj(act(fc(ln2(x)))), act gelu exact (erf) or relu, the MLP
    d_mlp wide (0: 4·d_model); without LayerNorm, ln1 and ln2 are the identity."""

    def __init__(self, d_model, attention, mlp, cross=False, layer_norm=True, d_mlp=0, activation="gelu"):
        super().__init__()
        self.ln1 = norm(d_model, layer_norm)
        self.attn = Attention(d_model, **attention)
        if cross:
            self.ln_cross = torch.nn.LayerNorm(d_model, eps=1e-5)
            self.cross_attn = Attention(d_model, **attention)
        if mlp:
            hidden = d_mlp or 4 * d_model
            self.ln2 = norm(d_model, layer_norm)
            self.mlp = torch.nn.Module()
            self.mlp.fc = torch.nn.Linear(d_model, hidden)
            self.mlp.proj = torch.nn.Linear(hidden, d_model)
            self.act = F.relu if activation == "relu" else F.gelu

    def forward(self, x, causal, key_padding=None, memory=None, memory_padding=None):
        h = self.ln1(x)
        out, scores = self.attn(h, h, causal, key_padding)
        x = x + out
        if memory is not None:
            x = x + self.cross_attn(self.ln_cross(x), memory, False, memory_padding)[0]
        if hasattr(self, "mlp"):
            x = x + self.mlp.proj(self.act(self.mlp.fc(self.ln2(x))))
        return x, scores


def attention_of(c):
    heads = c["heads"]
    return {"heads": heads, "d_head": c["d_head"] or c["d_model"] // heads, "kv_heads": c.get("kv_heads") or heads,
            "qk": c["qk"], "proj": c["proj"], "scale": c.get("scale", True), "bias": c.get("attention_bias", True)}


class Transformer(torch.nn.Module):
    """qkv's decoder-only Transformer (nn/transformer.hpp): token and position embeddings, pre-
    LayerNorm blocks (or none: layer_norm false), and the readout: a final LayerNorm and a linear head (token), or the last
    layer's head 0's scores over the keys, before softmax (pointer). forward(tokens (B, T)) returns
    the logits qkv's model returns: (B, T, n_classes), or (B, T, T) scores with −inf where masked."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = dict(cfg)
        D, L = cfg["d_model"], cfg["layers"]
        self.tok = torch.nn.Embedding(cfg["vocab_size"], D)
        if cfg["positions"] == "learned":
            self.pos = torch.nn.Embedding(cfg["max_len"], D)
        else:
            self.register_buffer("sinusoids", torch.tensor(sinusoids(cfg["max_len"], D)), persistent=False)
        self.causal = list(cfg.get("causal_layers") or [cfg["causal"]] * L)
        layer_norm = cfg.get("layer_norm", True)
        self.blocks = torch.nn.ModuleList(Block(D, attention_of(cfg), cfg["mlp"], layer_norm=layer_norm,
                                                d_mlp=cfg.get("d_mlp", 0), activation=cfg.get("activation", "gelu"))
                                          for _ in range(L))
        self.ln_final = norm(D, layer_norm)
        if cfg["readout"] == "token":
            self.head = torch.nn.Linear(D, cfg["n_classes"])
        if cfg.get("embeddings") == "frozen":  # embeddings and every LayerNorm stay at their init
            frozen = [self.tok, self.ln_final] + [getattr(self, "pos", None)]
            for b in self.blocks:
                frozen += [b.ln1, getattr(b, "ln2", None)]
            for module in frozen:
                if module is not None:
                    module.requires_grad_(False)

    def positions(self, T):
        return self.pos.weight[:T] if hasattr(self, "pos") else self.sinusoids[:T].to(self.tok.weight.dtype)

    def forward(self, tokens, key_padding=None):
        """tokens (B, T) or (T); key_padding (B, T), False at padding, masks those keys in every
        layer, as qkv's Transformer.forward does with one."""
        tokens = torch.as_tensor(tokens)
        if tokens.dim() == 1:
            tokens = tokens[None]
        if key_padding is not None:
            key_padding = torch.as_tensor(key_padding, dtype=torch.bool)
        x = self.tok(tokens) + self.positions(tokens.shape[1])
        scores = None
        for block, causal in zip(self.blocks, self.causal):
            x, scores = block(x, causal, key_padding)
        if self.cfg["readout"] == "pointer":
            return scores[:, 0]
        return self.head(self.ln_final(x))


class EncoderDecoder(torch.nn.Module):
    """qkv's encoder-decoder (nn/seq2seq.hpp): bidirectional encoder blocks and ln_enc make the
    memory; causal decoder blocks with a cross-attention to it, ln_final and the head make the
    logits. forward(source (B, S), tokens (B, T), source_padding (B, S) or None) returns (B, T,
    tgt_vocab)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = dict(cfg)
        D = cfg["d_model"]
        attention = attention_of(dict(cfg, kv_heads=0))
        self.src_tok = torch.nn.Embedding(cfg["src_vocab"], D)
        self.tgt_tok = torch.nn.Embedding(cfg["tgt_vocab"], D)
        if cfg["positions"] == "learned":
            self.src_pos = torch.nn.Embedding(cfg["max_src_len"], D)
            self.tgt_pos = torch.nn.Embedding(cfg["max_tgt_len"], D)
        else:
            self.register_buffer("src_sinusoids", torch.tensor(sinusoids(cfg["max_src_len"], D)), persistent=False)
            self.register_buffer("tgt_sinusoids", torch.tensor(sinusoids(cfg["max_tgt_len"], D)), persistent=False)
        self.encoder = torch.nn.Module()
        self.encoder.blocks = torch.nn.ModuleList(Block(D, attention, cfg["mlp"]) for _ in range(cfg["encoder_layers"]))
        self.ln_enc = torch.nn.LayerNorm(D, eps=1e-5)
        self.decoder = torch.nn.Module()
        self.decoder.blocks = torch.nn.ModuleList(Block(D, attention, cfg["mlp"], cross=True)
                                                  for _ in range(cfg["decoder_layers"]))
        self.ln_final = torch.nn.LayerNorm(D, eps=1e-5)
        self.head = torch.nn.Linear(D, cfg["tgt_vocab"])

    def embed(self, side, ids):
        table = getattr(self, side + "_tok")
        if hasattr(self, side + "_pos"):
            positions = getattr(self, side + "_pos").weight[:ids.shape[1]]
        else:
            positions = getattr(self, side + "_sinusoids")[:ids.shape[1]].to(table.weight.dtype)
        return table(ids) + positions

    def encode(self, source, source_padding=None):
        if source_padding is not None:
            source_padding = torch.as_tensor(source_padding, dtype=torch.bool)
        x = self.embed("src", torch.as_tensor(source))
        for block in self.encoder.blocks:
            x = block(x, False, source_padding)[0]
        return self.ln_enc(x)

    def forward(self, source, tokens, source_padding=None):
        source, tokens = torch.as_tensor(source), torch.as_tensor(tokens)
        if source_padding is not None:
            source_padding = torch.as_tensor(source_padding, dtype=torch.bool)
        memory = self.encode(source, source_padding)
        y = self.embed("tgt", tokens)
        for block in self.decoder.blocks:
            y = block(y, True, memory=memory, memory_padding=source_padding)[0]
        return self.head(self.ln_final(y))


def to_torch(model):
    """A torch.nn.Module of a qkv Transformer or EncoderDecoder, holding copies of its parameters
    (as qkv names them) in their dtype; its logits equal qkv's within float32 rounding."""
    if isinstance(model, _qkv.Transformer):
        module = Transformer(model.cfg)
    elif isinstance(model, _qkv.EncoderDecoder):
        module = EncoderDecoder(model.cfg)
    else:
        raise TypeError(f"to_torch: a qkv.Transformer or qkv.EncoderDecoder, not {type(model).__name__}")
    state = model.state_dict()
    dtype = torch.float64 if next(iter(state.values())).dtype == np.float64 else torch.float32
    module.to(dtype)
    mine = module.state_dict()
    missing, unexpected = sorted(set(mine) - set(state)), sorted(set(state) - set(mine))
    if missing or unexpected:  # a model this module does not describe: a bug, said as such
        raise ValueError(f"to_torch: the module's parameters differ from the model's: missing {missing}, "
                         f"unexpected {unexpected}")
    module.load_state_dict({name: torch.from_numpy(np.array(value)) for name, value in state.items()})
    return module
