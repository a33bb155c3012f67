#!/usr/bin/env bash
# Runs examples/custom_task into RUN and checks that the report it wrote through the library (text,
# JSON, HTML) is what `qkv inspect RUN --input TEXT` shows, byte for byte, TEXT as custom_task names it;
# and that qkv eval and ablate read the held-out sequences it saved.
# Usage: tests/cli/same_report.sh CUSTOM_TASK QKV RUN
set -euo pipefail
custom_task="$1" qkv="$2" run="$3"
rm -rf "$run"
out=$("$custom_task" "$run")
text=$(sed -n 's/.*as qkv inspect .* --input "\(.*\)" shows them$/\1/p' <<<"$out")
[[ -n "$text" ]] || { echo "custom_task named no input:"; echo "$out"; exit 1; }
"$qkv" inspect "$run" --input "$text" > "$run/cli.txt"
"$qkv" inspect "$run" --input "$text" --json > "$run/cli.json"
"$qkv" inspect "$run" --input "$text" --html "$run/cli.html" 2> /dev/null
for kind in txt json html; do
  cmp "$run/report.$kind" "$run/cli.$kind" || { diff "$run/report.$kind" "$run/cli.$kind" | head -20; exit 1; }
done
# The reports hold the run's own names: a table row of the text, and the input's names in the JSON.
grep -q "input: seal2 orca1" "$run/cli.txt"
grep -q '"orca0"' "$run/cli.json"
# qkv eval and ablate on the held-out sequences custom_task saved: the accuracy custom_task computed
# itself, and the head needed (zero-ablated it falls below half), its patch restoring the answers.
expected=$(sed -n 's/.*held-out accuracy \([0-9.e-]*\)$/\1/p' <<<"$out")
eval_json=$("$qkv" eval "$run" --data "$run/held_out.jsonl")
python3 - "$expected" "$eval_json" <<'PY'
import json, sys
expected, got = float(sys.argv[1]), json.loads(sys.argv[2])
assert got["sequences"] == 256 and abs(got["accuracy"] - expected) < 1e-12, (expected, got)
PY
ablate_json=$("$qkv" ablate "$run" --data "$run/held_out.jsonl" --json)
python3 - "$ablate_json" <<'PY'
import json, sys
a = json.loads(sys.argv[1])
head = a["heads"][0]
assert a["seed"] is None and a["data"].endswith("held_out.jsonl"), a
assert a["clean"]["accuracy"] > 0.99 and a["corrupted"]["accuracy"] < 0.5, a
assert head["needed"] and head["denoising_share"] > 0.9 and head["noising_share"] > 0.9, head
PY
echo "custom_task's report is qkv inspect's: text $(wc -c < "$run/cli.txt"), JSON $(wc -c < "$run/cli.json"), HTML $(wc -c < "$run/cli.html") bytes"
