#!/usr/bin/python3
"""The PyTorch twin of `qkv train modadd`: Nanda et al.'s modular-addition model and training.

    bench/grokking_torch.py [--p 113] [--steps 200] [--threads 1] [--seed 0] [--log-every 100]
                            [--weight-decay 1.0] [--metrics FILE]

The model as the progress-measures paper's transformers.py builds it: token and position
embeddings, one block (attention of 4 heads of 32 without biases, causal, then an MLP of 512
with ReLU, no LayerNorm), an unembedding of p + 1 outputs without bias, the loss read at the '='
position. Every weight randn / sqrt(d_model), the unembedding's randn / sqrt(d_vocab), biases 0.
Training: full batch over 30% of the p^2 pairs (shuffled by the seed), AdamW (lr 1e-3, weight
decay 1, betas (0.9, 0.98)), the rate ramped over 10 steps, the held-out loss and accuracy every
--log-every steps. Prints one JSON line: steps, seconds, steps_per_second and the last metrics.
"""
import argparse
import json
import random
import time

import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def __init__(self, p, d_model=128, heads=4, d_head=32, d_mlp=512, n_ctx=3):
        super().__init__()
        V = p + 1
        s = d_model ** -0.5
        self.heads, self.d_head = heads, d_head
        self.W_E = torch.nn.Parameter(torch.randn(d_model, V) * s)
        self.W_pos = torch.nn.Parameter(torch.randn(n_ctx, d_model) * s)
        self.W_K = torch.nn.Parameter(torch.randn(heads, d_head, d_model) * s)
        self.W_Q = torch.nn.Parameter(torch.randn(heads, d_head, d_model) * s)
        self.W_V = torch.nn.Parameter(torch.randn(heads, d_head, d_model) * s)
        self.W_O = torch.nn.Parameter(torch.randn(d_model, d_head * heads) * s)
        self.W_in = torch.nn.Parameter(torch.randn(d_mlp, d_model) * s)
        self.b_in = torch.nn.Parameter(torch.zeros(d_mlp))
        self.W_out = torch.nn.Parameter(torch.randn(d_model, d_mlp) * s)
        self.b_out = torch.nn.Parameter(torch.zeros(d_model))
        self.W_U = torch.nn.Parameter(torch.randn(d_model, V) * V ** -0.5)
        self.register_buffer("mask", torch.tril(torch.ones(n_ctx, n_ctx)))

    def forward(self, x):
        x = torch.einsum("dbp->bpd", self.W_E[:, x]) + self.W_pos[: x.shape[-1]]
        k = torch.einsum("ihd,bpd->biph", self.W_K, x)
        q = torch.einsum("ihd,bpd->biph", self.W_Q, x)
        v = torch.einsum("ihd,bpd->biph", self.W_V, x)
        scores = torch.einsum("biph,biqh->biqp", k, q)
        T = x.shape[-2]
        scores = torch.tril(scores) - 1e10 * (1 - self.mask[:T, :T])
        attn = F.softmax(scores / self.d_head ** 0.5, dim=-1)
        z = torch.einsum("biph,biqp->biqh", v, attn)
        z = z.permute(0, 2, 1, 3).reshape(x.shape[0], T, -1)
        x = x + torch.einsum("df,bqf->bqd", self.W_O, z)
        h = F.relu(torch.einsum("md,bpd->bpm", self.W_in, x) + self.b_in)
        x = x + torch.einsum("dm,bpm->bpd", self.W_out, h) + self.b_out
        return x @ self.W_U


def loss_and_accuracy(logits, labels):
    last = logits[:, -1].float()
    return F.cross_entropy(last, labels), (last.argmax(-1) == labels).float().mean().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=int, default=113)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--weight-decay", type=float, default=1.0)
    parser.add_argument("--fraction", type=float, default=0.3)
    parser.add_argument("--metrics", default="", help="write a JSON line of metrics every --log-every steps here")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    p = a.p
    pairs = [(i, j, p) for i in range(p) for j in range(p)]
    random.shuffle(pairs)
    cut = int(a.fraction * len(pairs))
    train, test = torch.tensor(pairs[:cut]), torch.tensor(pairs[cut:])
    train_labels, test_labels = (train[:, 0] + train[:, 1]) % p, (test[:, 0] + test[:, 1]) % p
    model = Model(p)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=a.weight_decay, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(step / 10, 1))
    out = open(a.metrics, "w") if a.metrics else None
    last = {}
    start = time.perf_counter()
    for step in range(a.steps):
        loss, accuracy = loss_and_accuracy(model(train), train_labels)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        if (step + 1) % a.log_every == 0 or step + 1 == a.steps:
            with torch.no_grad():
                test_loss, test_accuracy = loss_and_accuracy(model(test), test_labels)
            last = {"step": step + 1, "loss": loss.item(), "accuracy": accuracy, "test_loss": test_loss.item(),
                    "test_accuracy": test_accuracy, "seconds": time.perf_counter() - start}
            if out:
                out.write(json.dumps(last) + "\n")
                out.flush()
    seconds = time.perf_counter() - start
    print(json.dumps({"engine": "pytorch " + torch.__version__, "p": p, "steps": a.steps, "threads": a.threads,
                      "params": sum(t.numel() for t in model.parameters()),
                      "seconds": seconds, "steps_per_second": a.steps / seconds, "last": last}))


if __name__ == "__main__":
    main()
