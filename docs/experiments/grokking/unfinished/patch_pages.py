#!/usr/bin/env python3
# Puts the grokking section (section.md and text.md beside this file) into docs/experiments.md, and
# its lines into the opening of that page and into README.md; run from the root of the sources.
import os, sys
def sub(path, old, new, count=1):
    t = open(path).read()
    if t.count(old) != count:
        sys.exit(f"{path}: expected {count} of {old[:60]!r}, found {t.count(old)}")
    open(path, "w").write(t.replace(old, new))

E = "docs/experiments.md"
sub(E, "(seeds 0–29; 100 for\n`tokens`), each at the budget its section states (6,000 steps for most,",
       "(seeds 0–29; 100 for\n`tokens`; 5 for `grokking`), each at the budget its section states (6,000 steps for most,")
sub(E, "`defaults` and `seq2seq` at each task's default budget, and reverse at twice it).",
       "`defaults` and `seq2seq` at each task's default budget, and reverse at twice it; `grokking` at\nthe paper's 40,000).")
sub(E, "and `alignment` (seq2seq) ([sweeps](sweeps.md)).",
       "`alignment` (seq2seq), and `grokking` (grokking) ([sweeps](sweeps.md)).")
sub(E, "configuration made on 2026-12-04 with the Cooperlake kernels of another processor.",
       "configuration made on 2026-12-04 with the Cooperlake kernels of another processor. `grokking`'s\nare those of `qkv experiment grokking -j 2` too, begun on 2026-12-06 with the Haswell kernels and\ngone on with by `--resume` ([its section](#grokking-modular-addition-as-nanda-et-al-train-it)).")
sub(E, "The twelve experiments were run once more,",
       "The twelve experiments (all but `grokking`) were run once more,")
here = os.path.dirname(os.path.abspath(__file__))
section = open(os.path.join(here, "section.md")).read() + open(os.path.join(here, "text.md")).read()
t = open(E).read().rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
open(E, "w").write(t)

R = "README.md"
sub(R, """[the runs](docs/cli.md#seq2seq-tasks-and-their-alignments)). Every table, with budgets, seeds and
controls, is in [docs/experiments.md](docs/experiments.md).""",
"""[the runs](docs/cli.md#seq2seq-tasks-and-their-alignments)). And a paper reproduced: Nanda et al.'s
grokking of modular addition (p = 113, 40,000 full-batch steps, `qkv experiment grokking`). With
the paper's weight decay, held-out accuracy jumps to 99% on <!--= grokking | decay=1 | rate grokking.test_99 != null -->…<!--/--> seeds, at
steps <!--= grokking | decay=1 | range grokking.test_99 int -->…<!--/-->, thousands of steps after training accuracy; the grokked models use
<!--= grokking | decay=1 | range grokking.key_count int -->…<!--/--> key frequencies (the paper: 5), and their restricted loss passes half-way before the jump on
<!--= grokking | decay=1 | count grokking.restricted_step < grokking.test_99 -->…<!--/-->; without weight decay, held-out accuracy reaches 99% on <!--= grokking | decay=0 | rate grokking.test_99 != null -->…<!--/-->
([side by side with the paper](docs/experiments.md#grokking-modular-addition-as-nanda-et-al-train-it)).
Every table, with budgets, seeds and controls, is in [docs/experiments.md](docs/experiments.md).""")

C = "docs/cli.md"
sub(C, "12.8: the first phase of grokking, memorisation.",
       "12.8: the first phase of grokking, memorisation. The whole 40,000 steps, on five seeds and without\nweight decay as the control, side by side with the paper: [the grokking experiment](experiments.md#grokking-modular-addition-as-nanda-et-al-train-it).")
