#!/usr/bin/env bash
# A single-node Slurm (munged, slurmctld and slurmd from Debian, configured in a temporary folder and
# stopped after) runs a sweep as a job array through `qkv sweep --slurm --submit`; its collected
# results are the local `-j 2` run's, bit for bit but the seconds. Skipped (exit 77) where Slurm or
# munge is not installed (scripts/install-deps --cluster installs them), or when not run as root
# (the daemons run as root, and munged's key is the system's).
#   tests/cluster/slurm.sh QKV
set -euo pipefail
qkv="$(realpath "$1")"
for tool in slurmctld slurmd munged sbatch squeue sinfo; do
  command -v "$tool" > /dev/null || { echo "skipped: $tool is not installed (scripts/install-deps --cluster)"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "skipped: a single-node Slurm is started as root (as in CI)"; exit 77; }
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
started_munge=""
stop() {
  for pid in "$work"/slurmd.pid "$work"/slurmctld.pid; do
    [ -s "$pid" ] && kill "$(cat "$pid")" 2> /dev/null || true
  done
  sleep 1
  [ -n "$started_munge" ] && [ -s /run/munge/munged.pid ] && kill "$(cat /run/munge/munged.pid)" 2> /dev/null || true
  rm -rf "$work"
}
trap stop EXIT

# munged, as user munge, unless one answers already.
if ! munge -n 2> /dev/null | unmunge > /dev/null 2>&1; then
  mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
  [ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2> /dev/null
  chmod 0400 /etc/munge/munge.key
  chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
  runuser -u munge -- /usr/sbin/munged
  started_munge=1
  for _ in $(seq 50); do munge -n 2> /dev/null | unmunge > /dev/null 2>&1 && break; sleep 0.1; done
fi

host="$(hostname)"
# Two free ports, for slurmctld and slurmd.
read -r ctld_port slurmd_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("", 0))
print(*(x.getsockname()[1] for x in s))')
mkdir -p "$work/state" "$work/spool"
cat > "$work/slurm.conf" <<CONF
ClusterName=qkvtest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$work/slurm.conf"
slurmctld
slurmd
for _ in $(seq 100); do
  sinfo -h -o %t 2> /dev/null | grep -q idle && break
  sleep 0.2
done
sinfo -h -o %t | grep -q idle || { echo "FAILED: the node did not come up"; cat "$work"/*.log; exit 1; }

cd "$work"
cp "$here/small-sweep.json" sweep.json
"$qkv" sweep sweep.json --out local -j 2 > /dev/null 2>&1 || { echo "FAILED: the local sweep"; exit 1; }
out="$("$qkv" sweep sweep.json --out slurm --slurm --per-task 3 --throttle 2 --submit)"
echo "$out"
job="$(sed -n 's/^Submitted batch job \([0-9]*\).*/\1/p' <<<"$out")"
[ -n "$job" ] || { echo "FAILED: sbatch gave no job id"; exit 1; }
for _ in $(seq 600); do
  [ -z "$(squeue -h -j "$job" 2> /dev/null)" ] && break
  sleep 0.5
done
[ -z "$(squeue -h -j "$job" 2> /dev/null)" ] || { echo "FAILED: the job array did not end in 300 s"; squeue; exit 1; }
ls slurm/slurm
"$qkv" sweep sweep.json --out slurm --collect || { echo "FAILED: collect"; cat slurm/slurm/*.out; exit 1; }
python3 "$here/same_results.py" local/results.jsonl slurm/results.jsonl
