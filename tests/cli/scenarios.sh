#!/usr/bin/env bash
# The qkv program as a user (or an attacker) meets it: a run folder damaged or raced in one way,
# then the command that must refuse it, with the exit code and a message naming the file and the
# field. CTest runs each scenario on its own:
#   tests/cli/scenarios.sh QKV_BINARY SCENARIO
set -uo pipefail
qkv="$1"
scenario="$2"
work="$(mktemp -d)"
trap 'kill -KILL $(jobs -p) 2>/dev/null; wait; rm -rf "$work"' EXIT
cd "$work"

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

# Runs a command; its exit code in $code, its stderr in $err.
run() {
  err="$("$@" 2>&1 >/dev/null)"
  code=$?
}

# expect CODE TEXT: the last run exited with CODE and said TEXT.
expect() {
  [ "$code" -eq "$1" ] || fail "exit code $code, expected $1; it said: $err"
  grep -qF -- "$2" <<<"$err" || fail "expected '$2' in: $err"
}

# A small trained run: checkpoints at steps 10, 20, 30, 40.
small_run() {
  "$qkv" train brackets --out "${1:-run}" --steps 40 --checkpoint-every 10 --layers 1 --heads 1 --d-model 8 \
    >/dev/null 2>&1 || fail "the small run did not train"
}

# config.json's FIELD set to VALUE (the file is written two spaces an indent, a field a line).
set_field() {
  sed -i -E "s/(\"$1\": )[^,]*/\1$2/" run/config.json
  grep -q "\"$1\": $2" run/config.json || fail "could not set $1"
}

# Every file of the run but its lock, which a refused command may take for a moment.
checksum() { find run -type f ! -name run.lock -exec sha256sum {} + | sort; }

case "$scenario" in
  batch-zero)  # was SIGFPE in eval, a heap overflow in resume
    small_run
    set_field batch 0
    run "$qkv" eval run
    expect 1 "run/config.json: 'batch' is 0, a full batch, but the brackets task draws its sequences"
    run "$qkv" train brackets --out run --resume
    expect 1 "run/config.json: 'batch' is 0, a full batch, but the brackets task draws its sequences"
    ;;
  batch-huge)  # was accuracy 0 on 0 sequences, exit 0
    small_run
    set_field batch 18446744073709551615
    run "$qkv" eval run
    expect 1 "run/config.json: 'batch' is 18446744073709551615, out of range"
    ;;
  warmup-float)  # was a float-to-integer cast out of range
    small_run
    set_field warmup 1e300
    run "$qkv" train brackets --out run --resume
    expect 1 "run/config.json: 'warmup' must be a whole number"
    ;;
  d-model-negative)
    small_run
    set_field d_model -16
    run "$qkv" inspect run
    expect 1 "run/config.json: 'model.d_model' is -16, out of range"
    ;;
  lr-zero)
    small_run
    set_field lr 0
    run "$qkv" eval run
    expect 1 "run/config.json: 'lr' is 0; it must be in (0, 10]"
    ;;
  d-model-huge)  # a 500-byte file must not allocate gigabytes
    small_run
    set_field d_model 500000
    run timeout 10 "$qkv" eval run
    expect 1 "run/config.json: 'model.d_model' needs about"
    run timeout 10 "$qkv" train brackets --out run --resume
    expect 1 "run/config.json: 'model.d_model' needs about"
    ;;
  vocab-other)  # was "embedding: index 3 out of range", exit 2
    small_run
    set_field vocab_size 3
    run "$qkv" eval run
    expect 1 "run/config.json: 'model.vocab_size' is 3, but the brackets task has 6 tokens"
    ;;
  shape-nested)  # was SIGSEGV printing the shape
    small_run
    perl -e '$h = q({"w":{"dtype":"F32","shape":) . ("[" x 100000) . ("]" x 100000) . q(,"data_offsets":[0,0]}});
             print pack("Q<", length($h)), $h' >run/checkpoint-00000040/model.safetensors
    for command in "eval run" "inspect run" "ablate run" "train brackets --out run --resume"; do
      run $qkv $command
      # A resume falls back to the checkpoint before, and says why.
      if [ "$command" = "train brackets --out run --resume" ]; then
        expect 0 "JSON nested more than 3 levels deep"
      else
        expect 1 "run/checkpoint-00000040/model.safetensors (its header): JSON nested more than 3 levels deep"
      fi
    done
    ;;
  fifo-config)  # was a hang
    small_run
    rm run/config.json
    mkfifo run/config.json
    run timeout 10 "$qkv" eval run
    expect 1 "run/config.json: is a FIFO, not a regular file"
    ;;
  folder-model)  # was std::bad_alloc, asking for 2^63 bytes
    small_run
    rm run/checkpoint-00000040/model.safetensors
    mkdir run/checkpoint-00000040/model.safetensors
    run "$qkv" eval run
    expect 1 "run/checkpoint-00000040/model.safetensors: is a folder, not a regular file"
    ;;
  config-folder)  # was "basic_filebuf::underflow", exit 2
    small_run
    rm run/config.json
    mkdir run/config.json
    run "$qkv" inspect run
    expect 1 "run/config.json: is a folder, not a regular file"
    ;;
  existing-out)  # was a silent replacement
    small_run
    before="$(checksum)"
    run "$qkv" train brackets --out run --steps 5
    expect 2 "--out run: holds a run already; give --resume to continue it or --force to replace it"
    for lr in inf 1e308 0 -1; do
      run "$qkv" train brackets --out run --force --lr "$lr"
      expect 2 "--lr: is"
    done
    [ "$before" = "$(checksum)" ] || fail "the run changed"
    "$qkv" eval run >/dev/null || fail "the run no longer loads"
    ;;
  foreign-folder)  # a folder of the user's own is refused as it is
    mkdir -p mine/build.tmp
    echo notes >mine/notes.txt
    run "$qkv" train brackets --out mine
    expect 2 "--out mine: holds"
    [ -d mine/build.tmp ] && [ ! -e mine/run.lock ] && [ "$(ls mine | wc -l)" -eq 2 ] || fail "the folder was touched"
    # Another program's file named checkpoint (TensorFlow writes one) is no qkv run: --force is no cure.
    echo 'model_checkpoint_path: "ckpt-1"' >mine/checkpoint
    run "$qkv" train brackets --out mine --force
    expect 2 "--out mine: holds '"
    [ -f mine/checkpoint ] && [ -f mine/notes.txt ] || fail "the folder was touched"
    ;;
  force-replaces)  # the old run stays until the new one's first checkpoint
    small_run
    old_model="$(sha256sum <run/model.safetensors)"
    "$qkv" train brackets --out run --force --steps 100000 --checkpoint-every 100000 >/dev/null 2>err.txt &
    for _ in $(seq 100); do [ -s run.new.tmp/metrics.jsonl ] && break; sleep 0.1; done
    [ -d run.new.tmp ] || fail "the replacement does not train in run.new.tmp"
    [ "$(sha256sum <run/model.safetensors)" = "$old_model" ] || fail "the old run changed before the new one's checkpoint"
    kill $!
    wait $! 2>/dev/null
    code=$? err="$(cat err.txt)"
    expect 143 "before its first checkpoint: run keeps the run it had"
    "$qkv" eval run >/dev/null || fail "the old run no longer loads after the replacement was killed"
    grep -q '"steps": 40' run/config.json || fail "the old config changed"
    run "$qkv" train brackets --out run --force --steps 12 --checkpoint-every 5 --layers 1 --heads 1 --d-model 8
    expect 0 ""
    grep -q '"steps": 12' run/config.json || fail "the run was not replaced"
    [ ! -e run.new.tmp ] || fail "run.new.tmp is left over"
    [ "$(ls -d run/checkpoint-*/ | wc -l)" -eq 2 ] || fail "the old run's checkpoints are left over"
    # From inside the folder it replaces: the swap moves the working folder away.
    (cd run && "$qkv" train brackets --out . --force --steps 14 --checkpoint-every 5 --layers 1 --heads 1 --d-model 8 \
      >/dev/null 2>&1) || fail "--out . --force failed"
    grep -q '"steps": 14' run/config.json && [ -d run/checkpoint-00000014 ] || fail "--out . was not replaced"
    ;;
  lock)  # was two runs mixing one folder's files
    small_run
    "$qkv" train brackets --out run2 --steps 100000 >/dev/null 2>&1 &
    for _ in $(seq 100); do [ -s run2/config.json ] && break; sleep 0.1; done
    run "$qkv" train brackets --out run2 --resume
    expect 1 "run2: in use by another process (pid $!)"
    run "$qkv" train brackets --out run2 --force
    expect 1 "run2: in use by another process (pid $!)"
    ;;
  resume-metrics)  # the steps between the checkpoint and the kill were logged twice
    "$qkv" train brackets --out run --steps 400 --checkpoint-every 200 --layers 1 --heads 1 --d-model 8 >/dev/null 2>&1
    # As if killed at step 350: the run's checkpoint at 200, its log to 300 and half a line.
    rm -rf run/checkpoint-00000400
    ln -sfn checkpoint-00000200 run/checkpoint
    head -n 3 run/metrics.jsonl >run/m && printf '{"step":4' >>run/m && mv run/m run/metrics.jsonl
    touch run/config.json.tmp
    mkdir run/checkpoint-00000300.tmp
    run "$qkv" train brackets --out run --resume
    expect 0 ""
    steps="$(grep -o '"step":[0-9]*' run/metrics.jsonl | cut -d: -f2 | tr '\n' ' ')"
    [ "$steps" = "100 200 300 400 " ] || fail "metrics.jsonl holds steps $steps"
    [ ! -e run/config.json.tmp ] && [ ! -e run/checkpoint-00000300.tmp ] || fail "partial files are left over"
    ;;
  config-records)  # --checkpoint-every, --threads and the BLAS kernels are saved; a resume says when they differ
    "$qkv" train brackets --out run --steps 20 --checkpoint-every 7 --threads 2 --layers 1 --heads 1 --d-model 8 \
      >/dev/null 2>&1
    grep -q '"checkpoint_every": 7' run/config.json || fail "checkpoint_every is not saved"
    grep -q '"threads": 2' run/config.json || fail "threads is not saved"
    grep -q '"blas": "[A-Za-z0-9]*"' run/config.json || fail "the BLAS kernels are not saved"
    rm -rf run/checkpoint-00000020
    ln -sfn checkpoint-00000014 run/checkpoint
    run "$qkv" train brackets --out run --resume --threads 1
    expect 0 "the run started on 2 threads and resumes on 1"
    set_field blas '"Elsewhere"'
    rm -rf run/checkpoint-00000020
    ln -sfn checkpoint-00000014 run/checkpoint
    run "$qkv" train brackets --out run --resume
    expect 0 "the run started on the Elsewhere BLAS kernels"
    ;;
  step-out-of-range)  # a checkpoint step of -1, or past the run's steps, trained nothing and exited 0
    small_run
    for step in -1 99; do  # as long as "40": the header keeps its length
      for file in model optimizer; do
        perl -0777 -pi -e 's/"step":"40"/"step":"'$step'"/' run/checkpoint-00000040/$file.safetensors
      done
      run "$qkv" train brackets --out run --resume
      expect 0 "passed over"
      grep -qF "step '-1' is not a number" <<<"$err" || grep -qF "its files are from step 99" <<<"$err" \
        || fail "the fault is not named: $err"
      small_run run-b && rm -rf run && mv run-b run
    done
    ;;
  bad-command-lines)  # refused, never wrapped or capped
    run "$qkv" train brackets --seed -1
    expect 2 "--seed: must be a whole number"
    run "$qkv" train brackets --steps 99999999999999999999
    expect 2 "--steps: must be a whole number from 1 to 1000000000"
    run "$qkv" train brackets --layers 1000000
    expect 2 "--layers: must be a whole number"
    run "$qkv" eval run --n 0
    expect 2 "--n: must be a whole number"
    run "$qkv" ablate run --data held_out.jsonl --seed 3
    expect 2 "--seed excludes --data"
    [ ! -e runs ] || fail "a refused command wrote runs/"
    ;;
  data-file)  # a run scored on sequences of its own (brackets' text puts BOS first): a bad line is named, the run untouched
    small_run
    printf '%s\n' '{"tokens": "(())", "targets": [-100, -100, -100, 2, 1]}' > good.jsonl
    out="$("$qkv" eval run --data good.jsonl)" || fail "eval --data failed"
    grep -q '"sequences":1' <<<"$out" || fail "eval --data: $out"
    before="$(checksum)"
    printf '%s\n' '{"tokens": "(())", "targets": [-100, -100, -100, 2, 1]}' '{"tokens": "(()", "targets": [0, 1, 2, 9]}' > bad.jsonl
    run "$qkv" ablate run --data bad.jsonl
    expect 1 "bad.jsonl line 2: 'targets'[3] is 9, not a key position 0-3"
    [ "$(checksum)" = "$before" ] || fail "a refused data file changed the run"
    ;;
  sweep)  # a grid of runs: listed, run on two processes, skipped when rerun, merged; bad files named
    cat > grid.json <<'EOF2'
{"tasks": ["rps", "cycle"], "grid": {"qk": ["untied", "tied"]}, "fixed": {"steps": 20, "layers": 1}, "seeds": {"start": 3, "count": 2}}
EOF2
    [ "$("$qkv" sweep grid.json --list | wc -l)" -eq 8 ] || fail "--list did not print 8 runs"
    "$qkv" sweep grid.json --out grid -j 2 > summary.txt 2> progress.txt || fail "the sweep failed: $(cat progress.txt)"
    [ "$(wc -l < grid/results.jsonl)" -eq 8 ] || fail "results.jsonl has not 8 lines"
    [ "$(wc -l < grid/results.csv)" -eq 9 ] || fail "results.csv has not a header and 8 rows"
    grep -q "| cycle | tied | 2 | 0 |" summary.txt || fail "summary: $(cat summary.txt)"
    before="$(sha256sum grid/results/*)"
    "$qkv" sweep grid.json --out grid -j 2 > /dev/null 2> again.txt || fail "the rerun failed"
    grep -q ": accuracy" again.txt && fail "the rerun trained again: $(cat again.txt)"
    [ "$before" = "$(sha256sum grid/results/*)" ] || fail "the rerun changed the results"
    "$qkv" sweep grid.json --out grid --collect > /dev/null || fail "--collect failed"
    sed 's/"steps": 20/"steps": 0/' grid.json > bad.json
    run "$qkv" sweep bad.json --out bad
    expect 1 "bad.json: 'fixed' 'steps': must be a whole number from 1 to 1000000000, got '0'"
    [ ! -e bad ] || fail "a refused sweep wrote its folder"
    run "$qkv" sweep grid.json --out grid --index 2 --of 2
    expect 2 "--index: must be below --of (2), got 2"
    mkdir mine && echo mine > mine/notes.txt
    run "$qkv" sweep grid.json --out mine
    expect 2 "--out mine: holds files of something other than a sweep"
    ;;
  sweep-interrupt)  # a TERM to the sweep reaches its worker processes: they stop, none is left, a rerun finishes
    cat > long.json <<'EOF2'
{"tasks": ["brackets"], "fixed": {"steps": 1500, "layers": 1}, "seeds": {"count": 4}}
EOF2
    "$qkv" sweep long.json --out long -j 2 > /dev/null 2> progress.txt &
    sweep=$!
    # Both workers in a run (each run's folder made as it starts): the handlers are in place by then,
    # however slow the machine (a sanitizer build beside other jobs took more than 1.5 s).
    for _ in $(seq 600); do
      [ "$(find long/runs -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l)" -ge 2 ] && break
      sleep 0.1
    done
    sleep 0.5
    kill -TERM "$sweep"
    wait "$sweep"
    code=$?
    [ "$code" -eq 143 ] || fail "exit code $code, expected 143: $(cat progress.txt)"
    grep -q "interrupted; rerun it to go on" progress.txt || fail "no message: $(cat progress.txt)"
    sleep 0.5
    pgrep -f -- "--out long -j 2" > /dev/null && fail "a worker process outlived the sweep"
    [ "$(find long/results -name '*.json' | wc -l)" -lt 4 ] || fail "every run finished before the signal"
    "$qkv" sweep long.json --out long -j 2 > /dev/null 2>&1 || fail "the rerun failed"
    [ "$(wc -l < long/results.jsonl)" -eq 4 ] || fail "the rerun did not finish the runs"
    ;;
  masks-and-lengths)  # a mask per layer, recorded; positions past the task's, scored by eval
    "$qkv" train brackets --out run --steps 20 --attention causal,bidirectional --max-len 65 \
      --positions sinusoidal >/dev/null 2>&1 || fail "the run did not train"
    grep -qF '"causal_layers": [' run/config.json || fail "no causal_layers in config.json"
    grep -qF '"mask_padding": true' run/config.json || fail "no mask_padding in config.json"
    grep -qF '"positions": "sinusoidal"' run/config.json || fail "no positions in config.json"
    out="$("$qkv" eval run --n 32)"
    grep -qE '"lengths":"42-64"' <<<"$out" && ! grep -qF '"accuracy":null' <<<"$out" \
      || fail "eval did not score lengths 42-64: $out"
    run "$qkv" train brackets --out other --attention causal,
    expect 2 "--attention: '' is not causal or bidirectional"
    run "$qkv" train brackets --out other --attention causal,bidirectional,causal
    expect 2 "--attention: has 3 entries for 2 layers"
    run "$qkv" train brackets --out other --max-len 10
    expect 2 "--max-len: is 10, out of range [25"
    [ ! -e other ] || fail "a refused run created its folder"
    ;;
  memory)  # refused before allocating, naming the option
    run timeout 10 "$qkv" train brackets --out big --batch 1000000 --d-model 4096 --heads 8
    expect 2 "--batch: needs about"
    run timeout 10 "$qkv" train brackets --out big --layers 10000 --d-model 4096 --heads 8
    expect 2 "--layers: needs about"
    run timeout 10 "$qkv" train brackets --out big --heads 1000000 --d-head 1
    expect 2 "--heads: needs about"
    run timeout 10 "$qkv" train brackets --out big --max-len 1000000
    expect 2 "--max-len: needs about"
    [ ! -e big ] || fail "a refused run created its folder"
    ;;
  generate)  # a trained induction model continues the copy, the same with and without the KV cache
    "$qkv" train induction --out run >/dev/null 2>&1 || fail "the induction run did not train"
    block="7 31 2 44 19 5 38 12 26 40"
    out="$("$qkv" generate run --input "$block 7" --tokens 9)" || fail "generate failed"
    [ "$out" = "$block $block" ] || fail "generated '$out', not the copy"
    for sampling in "" "--temperature 1.5 --top-k 8 --seed 4"; do
      a="$("$qkv" generate run --input "$block 7" $sampling)" || fail "generate failed"
      b="$("$qkv" generate run --input "$block 7" $sampling --no-cache)" || fail "generate --no-cache failed"
      [ "$a" = "$b" ] || fail "with the cache '$a', without '$b'"
      [ "$(wc -w <<<"$a")" -eq 32 ] || fail "'$a' does not fill the model's 32 positions"
    done
    run "$qkv" generate run --input "$block 7" --tokens 22
    expect 2 "--tokens: 22 after 11 input tokens pass the model's 32 positions"
    small_run brackets
    run "$qkv" generate brackets --input "(("
    expect 2 "brackets: a brackets model predicts positions, not the next token: it cannot generate"
    ;;
  seq2seq)  # a translate model writes held-out sentences' translations, the same with and without the KV cache
    # 800 steps: a test of the program trains translate with its defaults to its target.
    "$qkv" train translate --out run --steps 800 >/dev/null 2>&1 || fail "the translate run did not train"
    while IFS='|' read -r source expected; do
      out="$("$qkv" generate run --input "$source")" || fail "generate failed on '$source'"
      [ "$out" = "$expected" ] || fail "'$source' became '$out', not '$expected'"
      for sampling in "" "--temperature 2 --top-k 4 --seed 9"; do
        a="$("$qkv" generate run --input "$source" $sampling)" || fail "generate failed"
        b="$("$qkv" generate run --input "$source" $sampling --no-cache)" || fail "generate --no-cache failed"
        [ "$a" = "$b" ] || fail "with the cache '$a', without '$b'"
      done
    done <<'SENTENCES'
big cat chases small mouse|ookii neko chiisai nezumi ou
dog sees old bear|inu furui kuma miru
young horse likes fish|wakai uma sakana konomu
lion bites black dog|raion kuroi inu kamu
SENTENCES
    eval="$("$qkv" eval run --n 256)" || fail "eval failed"
    # {"accuracy":…,"dir":…,"exact_match":FORCED,"generated":{"accuracy":…,"exact_match":GENERATED},…}
    forced="$(sed -E 's/.*"exact_match":([^,}]*),"generated".*/\1/' <<<"$eval")"
    generated="$(sed -E 's/.*"generated":\{[^}]*"exact_match":([^,}]*)\}.*/\1/' <<<"$eval")"
    awk -v f="$forced" -v g="$generated" 'BEGIN { exit !(f >= 0.99 && g >= 0.99) }' || fail "eval: $eval"
    run "$qkv" generate run --input "cat chases unicorn"
    expect 2 "--input: translate: cannot read 'unicorn'"
    run "$qkv" generate run --input "cat eats fish" --tokens 7
    expect 2 "--tokens: 7 pass the decoder's 6 positions"
    run "$qkv" ablate run
    expect 1 "run: a translate run, whose model is an encoder-decoder: ablation reads decoder-only models"
    run "$qkv" train translate --out other --kv-heads 1
    expect 2 "--kv-heads: is not for the translate task's encoder-decoder"
    run "$qkv" train brackets --out other --encoder-layers 2
    expect 2 "--encoder-layers: is for seq2seq tasks"
    ;;
  html-to-folder)  # a page written over a folder left the whole page as its temporary file
    small_run
    mkdir page.html
    run "$qkv" inspect run --html page.html
    expect 1 "page.html: renaming the temporary file failed"
    [ ! -e page.html.tmp ] || fail "page.html.tmp is left"
    ;;
  checkpoint-link)  # a link out of the run, or to itself: named by eval, repaired by a resume
    for target in /etc checkpoint; do
      small_run
      ln -sfn "$target" run/checkpoint
      run "$qkv" eval run
      expect 1 "run/checkpoint: is a link to '$target', not a link to one of the run's checkpoint-STEP folders"
      run "$qkv" train brackets --out run --resume
      expect 0 "resuming from run/checkpoint-00000040 (step 40), the newest checkpoint that loads; passed over:"
      [ "$(readlink run/checkpoint)" = checkpoint-00000040 ] || fail "the link to $target was not repaired"
      "$qkv" eval run >/dev/null || fail "the repaired run does not load"
      rm -rf run
    done
    # A folder where the run keeps its link to a file: refused before anything is written.
    small_run
    rm run/model.safetensors
    mkdir run/model.safetensors
    before="$(checksum)"
    run "$qkv" train brackets --out run --resume --steps 60
    expect 1 "run/model.safetensors: is a folder, where the run keeps its link to checkpoint/model.safetensors"
    [ "$before" = "$(checksum)" ] && [ ! -e run/model.safetensors.tmp ] && [ ! -e run/checkpoint-00000060 ] \
      || fail "the refused resume wrote to the run"
    ;;
  optimizer-state)  # a checkpoint that loads but is no state a run reaches is damaged: named, passed over
    # as long as the old value: the header keeps its length
    for rng in "1 2 3 4 5" "-1 -1 -1 -1" "0 0 0 0"; do
      small_run
      RNG="$rng" perl -0777 -pi -e 's/"rng":"([^"]*)"/sprintf(q("rng":"%-*s"), length($1), $ENV{RNG})/e' \
        run/checkpoint-00000040/optimizer.safetensors
      run "$qkv" train brackets --out run --resume
      expect 0 "run/checkpoint-00000040/optimizer.safetensors: 'rng' = \"$rng"
      grep -qF "resuming from run/checkpoint-00000030 (step 30)" <<<"$err" || fail "no fall-back: $err"
      rm -rf run
    done
    # Adam's average of squares made negative: its first value, found through the header.
    small_run
    perl -0777 -pi -e 'my $n = unpack("Q<", substr($_, 0, 8)); substr($_, 8, $n) =~ /"0\.exp_avg_sq":\{[^}]*"data_offsets":\[(\d+)/
      or die "no 0.exp_avg_sq"; substr($_, 8 + $n + $1, 4) = pack("f<", -2)' run/checkpoint-00000040/optimizer.safetensors
    run "$qkv" train brackets --out run --resume
    expect 0 "'0.exp_avg_sq' holds -2 at element 0, but an average of squares cannot be negative"
    grep -qF "resuming from run/checkpoint-00000030 (step 30)" <<<"$err" || fail "no fall-back: $err"
    ;;
  interrupt)  # Ctrl-C or a TERM lost every step since the last checkpoint, with no message
    # Stops a run when it has printed $1 (after it logged a step), with signal $2; its exit code
    # in $code, its stderr in $err, and the step of its checkpoint in $step.
    stop_when() {
      for _ in $(seq 300); do grep -qF "$1" err.txt && [ -s run/metrics.jsonl ] && break; sleep 0.1; done
      grep -qF "$1" err.txt && [ -s run/metrics.jsonl ] || fail "the run did not say '$1' and log a step: $(cat err.txt)"
      kill -"$2" "$pid"
      wait "$pid"
      code=$?
      err="$(cat err.txt)"
      step="$(sed -nE 's/.*interrupted at step ([0-9]+) of.*/\1/p' <<<"$err")"
      [ -n "$step" ] && [ "$(readlink run/checkpoint)" = "$(printf 'checkpoint-%08d' "$step")" ] \
        || fail "no checkpoint of the step it stopped at: $err"
    }
    set -m  # job control: a background job's SIGINT is not ignored, as from a terminal
    timeout 300 "$qkv" train brackets --out run --steps 1000000 --checkpoint-every 1000000 --layers 1 --heads 1 \
      --d-model 8 >/dev/null 2>err.txt &
    pid=$!
    stop_when "" INT
    expect 130 "interrupted at step $step of 1000000; the checkpoint of step $step is in run; continue with --resume"
    first="$step"
    timeout 300 "$qkv" train brackets --out run --resume >/dev/null 2>err.txt &
    pid=$!
    stop_when "qkv train: resuming run from step $first of 1000000" TERM
    expect 143 "interrupted at step"
    [ "$step" -ge "$first" ] || fail "stopped at step $step, before the $first it resumed from"
    ;;
  extend)  # --resume --steps N extends a run; fewer steps, or other options, are refused
    small_run
    run "$qkv" train brackets --out run --resume --steps 60
    expect 0 "extending run from 40 to 60 steps"
    grep -q '"steps": 60' run/config.json && [ -d run/checkpoint-00000060 ] || fail "the run was not extended"
    before="$(checksum)"
    run "$qkv" train brackets --out run --resume --steps 50
    expect 2 "--steps: is 50, fewer than the 60 of the run in run"
    run "$qkv" train brackets --out run --resume --lr 0.1
    expect 2 "--resume: the run's options come from its config.json (but --steps, which extends it): drop --lr"
    [ "$before" = "$(checksum)" ] || fail "a refused resume changed the run"
    ;;
  experiment-force)  # a rerun silently replaced an experiment's results
    "$qkv" experiment causal --steps 2 --seeds 1 --out e >/dev/null 2>&1 || fail "the experiment did not run"
    before="$(sha256sum e/results.json)"
    run "$qkv" experiment causal --steps 3 --seeds 1 --out e
    expect 2 "--out e: holds an experiment's results already; give --force to replace them"
    [ "$before" = "$(sha256sum e/results.json)" ] || fail "the results changed"
    run "$qkv" experiment causal --steps 3 --seeds 1 --out e --force
    expect 0 "qkv experiment: wrote e/results.json"
    grep -q '"steps": 3' e/results.json || fail "--force did not replace the results"
    ;;
  experiment-file)  # a shipped experiment, printed, edited and run: as an experiment, then as a sweep of the same runs
    "$qkv" experiment causal --steps 3 --seeds 1 --print >mine.json || fail "--print failed"
    grep -q '"steps": 3' mine.json && [ ! -e runs ] || fail "--print did not print the budget's sweep, or ran it"
    sed -i 's/"steps": 3/"steps": 4/' mine.json
    run "$qkv" experiment mine.json --out e -j 2
    expect 0 "qkv experiment: wrote e/results.json, e/table.md, e/mine.svg"
    grep -q '"experiment": "mine"' e/results.json && grep -q '"steps": 4' e/results.json || fail "not the edited file's runs"
    [ "$(wc -l < e/results.jsonl)" -eq 4 ] || fail "results.jsonl has not the 4 runs"
    before="$(sha256sum e/results.jsonl)"
    run "$qkv" sweep e/sweep.json --out e
    expect 0 "4 runs in e"
    [ "$before" = "$(sha256sum e/results.jsonl)" ] || fail "the sweep of the experiment's sweep.json trained other runs"
    run "$qkv" experiment symetry
    expect 2 "unknown experiment 'symetry' (known: ablations"
    echo '{"tasks": ["rps"], "grids": {}}' >bad.json
    run "$qkv" experiment bad.json
    expect 1 "bad.json: unknown key 'grids'"
    ;;
  term-dumb)  # colours and in-place lines only for a terminal that shows them
    small_run
    has_escape() { grep -q $'\033\\[' "$1"; }
    TERM=xterm script -qec "$qkv inspect run" /dev/null >color.txt
    has_escape color.txt || fail "no colour on a terminal"
    TERM=dumb script -qec "$qkv inspect run" /dev/null >plain.txt
    ! has_escape plain.txt || fail "colour with TERM=dumb"
    TERM=dumb script -qec "$qkv train brackets --out other --steps 20" /dev/null >train.txt
    ! has_escape train.txt || fail "escapes in train's progress with TERM=dumb"
    ;;
  patch)  # activation patching from the program: the library's numbers; bad components and tasks refused
    "$qkv" train induction --out run --steps 300 >/dev/null 2>&1 || fail "the induction run did not train"
    json="$("$qkv" patch run --component z --n 32 --json)" || fail "patch --json"
    python3 - "$json" <<'PY' || fail "patch --json: $json"
import json, sys
p = json.loads(sys.argv[1])
assert (p["component"], p["direction"], p["sequences"], p["by_position"]) == ("z", "denoising", 32, False)
assert [len(l["heads"]) for l in p["layers"]] == [1, 1]
for layer in p["layers"]:
    s = layer["heads"][0]["patched"][0]
    want = (s["loss"] - p["corrupted"]["loss"]) / (p["clean"]["loss"] - p["corrupted"]["loss"])
    assert abs(s["loss_share"] - want) < 1e-12, (s, want)
PY
    "$qkv" patch run --component k --by-position --n 16 --svg pictures >text.txt 2>/dev/null || fail "patch --svg"
    [ -s pictures/patch-k.svg ] || fail "no pictures/patch-k.svg"
    grep -q "the largest shares of loss" text.txt || fail "no largest shares: $(cat text.txt)"
    run "$qkv" patch run --component resid
    expect 2 "no component 'resid' (one of resid_pre"
    run "$qkv" patch run --component mlp_out
    expect 1 "the component mlp_out needs the MLP, and the model has none"
    small_run other
    run "$qkv" patch other --component z
    expect 1 "other: the task brackets has no corrupted input to patch from"
    # Path patching and direct logit attribution: their JSON adds up as the library's does.
    json="$("$qkv" patch run --path --noising --n 32 --json)" || fail "patch --path --json"
    python3 - "$json" <<'PY' || fail "patch --path --json: $json"
import json, sys
p = json.loads(sys.argv[1])
assert p["direction"] == "noising"
assert [(x["sender"], x["receiver"], x["input"]) for x in p["paths"]] == [
    ("L0H0", "logits", "logits"), ("L0H0", "L1H0", "q"), ("L0H0", "L1H0", "k"), ("L0H0", "L1H0", "v"), ("L1H0", "logits", "logits")]
for x in p["paths"]:
    want = (x["loss"] - p["clean"]["loss"]) / (p["corrupted"]["loss"] - p["clean"]["loss"])
    assert abs(x["loss_share"] - want) < 1e-12, (x, want)
PY
    "$qkv" patch run --path --n 16 | grep -q "^L0H0    L1H0      k " || fail "no L0H0 → L1H0 k row"
    run "$qkv" patch run --path --by-position
    expect 2 "--path excludes --by-position"
    run "$qkv" patch run
    expect 2 "--component or --path"
    json="$("$qkv" attribute run --n 16 --json)" || fail "attribute --json"
    python3 - "$json" <<'PY' || fail "attribute --json: $json"
import json, sys
a = json.loads(sys.argv[1])
parts = a["embed"] + a["pos_embed"] + a["bias"] + sum(l["attention"] for l in a["layers"])
assert abs(parts - a["logit_diff"]) < 1e-4 * max(1, abs(a["logit_diff"])), (parts, a["logit_diff"])
for l in a["layers"]:
    assert abs(l["attention"] - l["attn_bias"] - sum(h["logit_diff"] for h in l["heads"])) < 1e-9, l
PY
    run "$qkv" attribute other
    expect 1 "other: the task brackets reads out with the pointer readout"
    ;;
  across-training)  # checkpoints kept along training, measured at each: the library's numbers; bad schedules refused
    "$qkv" train induction --out run --steps 200 --keep-checkpoints log >/dev/null 2>&1 || fail "the kept run did not train"
    ls run/checkpoints >kept.txt
    [ "$(tr '\n' ' ' <kept.txt)" = "step-00000000.safetensors step-00000010.safetensors step-00000013.safetensors step-00000016.safetensors step-00000020.safetensors step-00000025.safetensors step-00000032.safetensors step-00000040.safetensors step-00000050.safetensors step-00000063.safetensors step-00000079.safetensors step-00000100.safetensors step-00000126.safetensors step-00000158.safetensors step-00000200.safetensors " ] \
      || fail "kept: $(cat kept.txt)"
    json="$("$qkv" inspect run --across-training --json)" || fail "inspect --across-training --json"
    python3 - "$json" <<'PY' || fail "inspect --across-training --json: $json"
import json, sys
a = json.loads(sys.argv[1])
steps = [c["step"] for c in a["checkpoints"]]
assert steps == [0, 10, 13, 16, 20, 25, 32, 40, 50, 63, 79, 100, 126, 158, 200], steps
for c in a["checkpoints"]:
    ic = c["in_context"]
    assert abs(ic["score"] - (ic["late"] - ic["early"])) < 1e-12, ic
    assert [(h["layer"], h["head"]) for h in c["heads"]] == [(0, 0), (1, 0)]
    assert all(0 <= h["induction"] <= 1 and h["noising_share"] is not None for h in c["heads"]), c["heads"]
assert [h["head"] for h in a["half_way"]["heads"]] == ["L0H0", "L1H0"]
PY
    "$qkv" inspect run --across-training >text.txt || fail "inspect --across-training"
    grep -q "when each part formed" text.txt || fail "no formation lines: $(cat text.txt)"
    "$qkv" inspect run --across-training --svg pictures 2>/dev/null || fail "inspect --across-training --svg"
    [ -s pictures/across-training.svg ] && [ -s pictures/across-training-heads.svg ] || fail "no charts: $(ls pictures)"
    run "$qkv" train induction --out other --steps 20 --keep-checkpoints every:0
    expect 2 "--keep-checkpoints: is 'every:0': it must be log or every:N"
    [ ! -e other ] || fail "a refused run made its folder"
    run "$qkv" train induction --out other --steps 2000 --keep-checkpoints every:1
    expect 2 "keeps 2001 checkpoints"
    small_run other
    run "$qkv" inspect other --across-training
    expect 1 "other: the run kept no checkpoints along training"
    run "$qkv" inspect run --across-training --input "1 2 3"
    expect 2 "--input excludes --across-training"
    ;;
  fourier)  # a modadd run in the Fourier basis: text, JSON, the paper's charts, and another task's run refused
    "$qkv" train modadd --p 11 --d-model 16 --d-mlp 32 --steps 40 --log-every 10 --keep-checkpoints every:20 --out run \
      >/dev/null 2>&1 || fail "the modadd run did not train"
    grep -q '"test_accuracy"' run/metrics.jsonl || fail "no held-out accuracy in metrics.jsonl"
    "$qkv" inspect run --fourier >text.txt || fail "inspect --fourier"
    grep -q "modular addition, p = 11" text.txt && grep -q "along training" text.txt || fail "not the analysis: $(cat text.txt)"
    "$qkv" inspect run --fourier --json >out.json || fail "inspect --fourier --json"
    python3 - "$(cat out.json)" <<'PY' || fail "the JSON is not the analysis"
import json, sys
a = json.loads(sys.argv[1])
assert [row["step"] for row in a["along"]] == [0, 20, 40], a["along"]
assert len(a["final"]["embed"]) == 6 and a["final"]["p"] == 11
assert a["along"][-1]["restricted_loss"] == a["final"]["restricted_loss"]
PY
    "$qkv" inspect run --fourier --svg pictures 2>/dev/null || fail "inspect --fourier --svg"
    for chart in fourier-loss fourier-progress fourier-weight-norm; do
      [ -s "pictures/$chart.svg" ] || fail "no $chart.svg: $(ls pictures)"
    done
    grep -q ">1e-" pictures/fourier-loss.svg || grep -q ">1e0<\|>1<" pictures/fourier-loss.svg || fail "no log axis"
    small_run other
    run "$qkv" inspect other --fourier
    expect 2 "--fourier: other: a brackets run: the Fourier analysis reads a model of modular addition (the modadd task)"
    run "$qkv" inspect run --fourier --across-training
    expect 2 "--across-training excludes --fourier"
    ;;
  *)
    fail "no scenario '$scenario'"
    ;;
esac
echo "passed: $scenario"
