#!/usr/bin/env bash
# `mpirun -n 2 qkv sweep` runs a sweep on two MPI ranks, rank 0 merging; its results are the local
# `-j 2` run's, bit for bit but the seconds. Skipped (exit 77) where OpenMPI is not installed or qkv
# was built without it (scripts/install-deps --cluster installs it; CMake then finds it).
#   tests/cluster/mpi.sh QKV
set -euo pipefail
qkv="$(realpath "$1")"
command -v mpirun > /dev/null || { echo "skipped: mpirun is not installed (scripts/install-deps --cluster)"; exit 77; }
[[ "$(ldd "$qkv")" == *libmpi* ]] || { echo "skipped: qkv was built without MPI (configure again once it is installed)"; exit 77; }
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
"$qkv" sweep "$here/small-sweep.json" --out local -j 2 > /dev/null 2>&1 || { echo "FAILED: the local sweep"; exit 1; }
# As root (CI), OpenMPI asks to be told; two ranks on two cores.
mpirun --allow-run-as-root --oversubscribe -n 2 "$qkv" sweep "$here/small-sweep.json" --out mpi > summary.txt
grep -q "8 runs merged into mpi/results.jsonl" summary.txt || { echo "FAILED: rank 0 did not merge:"; cat summary.txt; exit 1; }
python3 "$here/same_results.py" local/results.jsonl mpi/results.jsonl
