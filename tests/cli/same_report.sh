#!/usr/bin/env bash
# Runs examples/custom_task into RUN and checks that the report it wrote through the library (text,
# JSON, HTML) is what `qkv inspect RUN --input TEXT` shows, byte for byte, TEXT as custom_task names it.
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
echo "custom_task's report is qkv inspect's: text $(wc -c < "$run/cli.txt"), JSON $(wc -c < "$run/cli.json"), HTML $(wc -c < "$run/cli.html") bytes"
