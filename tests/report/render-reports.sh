#!/usr/bin/env bash
# The `qkv inspect --html` pages of four trained runs as a reader's browser shows them
# (render_page.py, headless Chromium): induction with snapshots along training, brackets, whose
# one-character tokens were once drawn sideways, and a wide model (4 layers of 4 heads, d_model 64)
# whose page must stay within the size bound, and a sort model's cross-attention (an encoder-decoder,
# the true alignment outlined). Screenshots: OUT/inspect-NAME.png.
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
train induction --steps 600 --snapshot-every 100 --out "$work/induction"
train brackets --steps 300 --out "$work/brackets"
train induction --layers 4 --heads 4 --d-model 64 --steps 60 --snapshot-every 20 --out "$work/wide"
train sort --steps 300 --out "$work/sort"
for name in induction brackets wide sort; do
  "$qkv" inspect "$work/$name" --html "$work/$name.html"
  python3 "$here/render_page.py" "$work/$name.html" "$out/inspect-$name.png"
done
