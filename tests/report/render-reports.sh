#!/usr/bin/env bash
# The `qkv inspect --html` pages of four trained runs as a reader's browser shows them
# (render_page.py, headless Chromium): induction with snapshots along training (two-digit tokens),
# brackets with 2 layers of 4 heads, whose one-character tokens were once drawn sideways and whose
# readout head is the fifth, a wide model (4 layers of 4 heads, d_model 64) whose page must stay
# within the size bound, and a sort model's cross-attention (an encoder-decoder, the true alignment
# outlined). Each run has a metrics.jsonl, so each page must draw its training; render_page.py
# drives each page's Explore section (a head picked, the slider moved, a token hovered). Screenshots:
# OUT/inspect-NAME.png, and the brackets page again with its readout head shown,
# OUT/inspect-brackets-L1H0.png.
#   render-reports.sh QKV_BINARY OUT
set -euo pipefail
qkv=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
command -v python3 >/dev/null || { echo "render-reports: no python3; install it with scripts/install-deps --test"; exit 1; }
# Short runs: the induction circuit forms by step 400.
train() {
  "$qkv" train "$@" >"$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
}
train induction --steps 600 --snapshot-every 100 --keep-checkpoints log --out "$work/induction"
train brackets --heads 4 --steps 300 --out "$work/brackets"
train induction --layers 4 --heads 4 --d-model 64 --steps 60 --snapshot-every 20 --out "$work/wide"
train sort --steps 300 --out "$work/sort"
status=0  # every page checked, each fault told
for name in induction brackets wide sort; do
  "$qkv" inspect "$work/$name" --html "$work/$name.html"
  python3 "$here/render_page.py" "$work/$name.html" "$out/inspect-$name.png" || status=1
  grep -q '<h2>Training</h2>' "$work/$name.html" ||
    { echo "render-reports: $name.html draws no training, though $name/metrics.jsonl is there"; status=1; }
done
# The Explore section of each decoder-only page, its slider over the kept checkpoints (induction:
# 20 of them) or the snapshots of the same input (wide); brackets kept none, so its slider has one.
for name_steps in induction:20 wide:5 brackets:1; do
  name=${name_steps%:*} steps=${name_steps#*:}
  grep -q "id=\"explore-step\" min=\"0\" max=\"$((steps - 1))\"" "$work/$name.html" ||
    { echo "render-reports: $name.html has no Explore slider over $steps steps"; status=1; }
done
python3 "$here/render_page.py" "$work/brackets.html" "$out/inspect-brackets-L1H0.png" L1H0 || status=1
exit $status
