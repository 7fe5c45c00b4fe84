#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for `make test-slurm`: partitions `cpu` (default)
# and `gpu` (one GPU gres whose device file is /dev/null: enough for the scheduler to place
# `--gpus=1` jobs; the job itself finds no CUDA and runs on the CPU), no accounting database.
#
#   tests/slurm/local_cluster.sh [COMMAND ...]
#
# installs the Debian packages if missing (slurmctld, slurmd, slurm-client, munge; needs root),
# starts munged (unless one runs), slurmctld and slurmd, runs COMMAND (default: the cluster tests
# in tests/slurm/), and stops the daemons it started, by pid, whatever COMMAND returns.
#
# The config goes to /etc/slurm/slurm.conf (and gres.conf), where every SLURM command looks:
# the executor's job step (snakemake-executor-plugin-slurm-jobstep) removes SLURM_CONF from the
# environment of its inner `srun`, so a config elsewhere is not found inside jobs. An existing
# slurm.conf that this script did not write is left alone and the script stops.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
state="$(mktemp -d /tmp/dpmed-slurm.XXXXXX)"
conf_dir=/etc/slurm
marker="# written by dpmed tests/slurm/local_cluster.sh; state in"
started=()

log() { echo "local_cluster: $*" >&2; }

install_packages() {
    local missing=()
    for tool in slurmctld slurmd sbatch munged; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    [ ${#missing[@]} -eq 0 ] && return
    [ "$(id -u)" -eq 0 ] || { log "missing ${missing[*]}; run as root to install them"; exit 1; }
    log "installing slurmctld slurmd slurm-client munge (missing: ${missing[*]})"
    local pkgs=(slurmctld slurmd slurm-client munge)
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${pkgs[@]}" >"$state/apt.log" 2>&1 ||
        { apt-get update -q >>"$state/apt.log" 2>&1 &&
          apt-get install -y -q --no-install-recommends "${pkgs[@]}" >>"$state/apt.log" 2>&1; } ||
        { cat "$state/apt.log" >&2; exit 1; }
}

stop_started() {
    local pid
    for pid in "${started[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${started[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null || true
    done
    [ ${#started[@]} -eq 0 ] || log "stopped ${started[*]}"
}

finish() {
    local rc=$?
    stop_started
    if grep -qs "^$marker $state" "$conf_dir/slurm.conf"; then
        rm -f "$conf_dir/slurm.conf" "$conf_dir/gres.conf"
    fi
    if [ "$rc" -eq 0 ]; then rm -rf "$state"; else log "daemon logs kept in $state"; fi
}
trap finish EXIT

start_munge() {
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        log "munged already running"
        return
    fi
    [ -s /etc/munge/munge.key ] || { mungekey --create --force && chown munge:munge /etc/munge/munge.key; }
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
    started+=("$(cat /run/munge/munged.pid)")
}

write_config() {
    local host cpus mem
    host="$(hostname -s)"
    cpus="$(nproc)"
    mem="$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')"
    mkdir -p "$state/spool" "$state/ctld" "$conf_dir"
    if [ -e "$conf_dir/slurm.conf" ] && ! grep -q "^$marker" "$conf_dir/slurm.conf"; then
        log "$conf_dir/slurm.conf exists and was not written by this script; not touching it"
        exit 1
    fi
    cat >"$conf_dir/slurm.conf" <<CONF
$marker $state
ClusterName=dpmed-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
SlurmctldPort=${DPMED_SLURMCTLD_PORT:-16817}
SlurmdPort=${DPMED_SLURMD_PORT:-16818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ReturnToService=2
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# Without accounting, finished jobs are known only while slurmctld keeps them: long enough for
# Snakemake's squeue status checks and for the test to read every job's request afterwards.
MinJobAge=3600
NodeName=$host CPUs=$cpus RealMemory=$mem Gres=gpu:1 State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$host MaxTime=INFINITE State=UP
CONF
    echo "NodeName=$host Name=gpu File=/dev/null" >"$conf_dir/gres.conf"
    export SLURM_CONF="$conf_dir/slurm.conf"
}

start_slurm() {
    slurmctld -f "$SLURM_CONF"
    for _ in $(seq 100); do [ -s "$state/slurmctld.pid" ] && break; sleep 0.1; done
    started+=("$(cat "$state/slurmctld.pid")")
    slurmd -f "$SLURM_CONF"
    for _ in $(seq 100); do [ -s "$state/slurmd.pid" ] && break; sleep 0.1; done
    started+=("$(cat "$state/slurmd.pid")")
    for _ in $(seq 150); do
        if sinfo -h -N -o '%T' 2>/dev/null | grep -qx idle; then
            log "cluster up: $(sinfo -h -o '%P %D %T' | tr '\n' ' ')(config $SLURM_CONF)"
            return
        fi
        sleep 0.2
    done
    log "the node did not come up; slurmctld and slurmd logs follow"
    tail -n 30 "$state/slurmctld.log" "$state/slurmd.log" >&2 || true
    exit 1
}

install_packages
start_munge
write_config
start_slurm
if [ $# -eq 0 ]; then
    set -- "$repo/.venv/bin/python" -m pytest -p no:cacheprovider "$here" -v
fi
DPMED_SLURM_CLUSTER=1 "$@"
