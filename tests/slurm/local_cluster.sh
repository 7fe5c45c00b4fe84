#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for `make test-slurm`: partitions `cpu` (default)
# and `gpu` (one GPU gres whose device file is /dev/null: enough for the scheduler to place
# `--gpus=1` jobs; the job itself finds no CUDA and runs on the CPU), and job accounting: a
# private MariaDB (its data in the state folder) behind slurmdbd, with jobacct_gather/linux
# sampling each job step's memory every second, so that `sacct` sees every job's comment,
# elapsed time and peak RSS. (Debian's
# SLURM 22.05 has no file-based accounting storage: slurmdbd with MySQL/MariaDB is the only one
# `sacct` reads step peaks from.)
#
#   tests/slurm/local_cluster.sh [COMMAND ...]
#
# installs the Debian packages if missing (slurmctld, slurmd, slurmdbd, slurm-client, munge,
# mariadb-server; needs root), starts munged (unless one runs), MariaDB, slurmdbd, slurmctld and
# slurmd, runs COMMAND (default: the cluster tests in tests/slurm/), and stops the daemons it
# started, by pid, in reverse order, whatever COMMAND returns.
#
# The config goes to /etc/slurm/slurm.conf (and gres.conf), where every SLURM command looks:
# the executor's job step (snakemake-executor-plugin-slurm-jobstep) removes SLURM_CONF from the
# environment of its inner `srun`, so a config elsewhere is not found inside jobs. An existing
# slurm.conf (or slurmdbd.conf) that this script did not write is left alone and the script
# stops.
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
    for tool in slurmctld slurmd slurmdbd sbatch munged mariadbd; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    [ ${#missing[@]} -eq 0 ] && return
    [ "$(id -u)" -eq 0 ] || { log "missing ${missing[*]}; run as root to install them"; exit 1; }
    local pkgs=(slurmctld slurmd slurmdbd slurm-client munge mariadb-server)
    log "installing ${pkgs[*]} (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${pkgs[@]}" >"$state/apt.log" 2>&1 ||
        { apt-get update -q >>"$state/apt.log" 2>&1 &&
          apt-get install -y -q --no-install-recommends "${pkgs[@]}" >>"$state/apt.log" 2>&1; } ||
        { cat "$state/apt.log" >&2; exit 1; }
}

stop_started() {  # the last started first: slurmctld flushes to slurmdbd, slurmdbd to MariaDB
    local i pid
    for ((i = ${#started[@]} - 1; i >= 0; i--)); do
        pid="${started[i]}"
        kill "$pid" 2>/dev/null || true
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
    if grep -qs "^$marker $state" "$conf_dir/slurmdbd.conf"; then
        rm -f "$conf_dir/slurmdbd.conf"
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

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_mariadb() {  # a private server: data, socket and logs in the state folder, TCP on loopback
    mariadb-install-db --no-defaults --user=root --datadir="$state/db" --skip-test-db \
        --auth-root-authentication-method=socket >"$state/mariadb-install.log" 2>&1 ||
        { cat "$state/mariadb-install.log" >&2; exit 1; }
    mariadbd --no-defaults --user=root --datadir="$state/db" --socket="$state/mysql.sock" \
        --port="$db_port" --bind-address=127.0.0.1 --skip-name-resolve \
        --pid-file="$state/mariadb.pid" --log-error="$state/mariadb.log" &
    started+=("$!")
    for _ in $(seq 100); do
        mariadb --no-defaults -S "$state/mysql.sock" -e 'select 1' >/dev/null 2>&1 && break
        sleep 0.2
    done
    mariadb --no-defaults -S "$state/mysql.sock" -e "CREATE USER 'slurm'@'127.0.0.1'
        IDENTIFIED BY 'dpmed'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

start_slurmdbd() {
    local host
    host="$(hostname -s)"
    if [ -e "$conf_dir/slurmdbd.conf" ] && ! grep -q "^$marker" "$conf_dir/slurmdbd.conf"; then
        log "$conf_dir/slurmdbd.conf exists and was not written by this script; not touching it"
        exit 1
    fi
    mkdir -p "$conf_dir"
    (umask 077 && cat >"$conf_dir/slurmdbd.conf" <<CONF
$marker $state
AuthType=auth/munge
DbdHost=$host
DbdPort=$dbd_port
SlurmUser=root
PidFile=$state/slurmdbd.pid
LogFile=$state/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=dpmed
StorageLoc=slurm_acct_db
CONF
    )
    slurmdbd
    for _ in $(seq 100); do [ -s "$state/slurmdbd.pid" ] && break; sleep 0.1; done
    started+=("$(cat "$state/slurmdbd.pid")")
}

add_associations() {  # the cluster, the account the test profile names, and root in it
    for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
    sacctmgr -i add cluster dpmed-test >/dev/null
    sacctmgr -i add account dpmed cluster=dpmed-test >/dev/null
    sacctmgr -i add user root account=dpmed cluster=dpmed-test >/dev/null
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
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$host
AccountingStoragePort=$dbd_port
# the executor keeps each job's rule and wildcards in its comment; the test reads it
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
# Finished jobs stay in slurmctld for an hour, so the test reads every job's request with
# scontrol afterwards.
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
db_port="$(free_port)"
dbd_port="$(free_port)"
start_munge
start_mariadb
write_config
start_slurmdbd
add_associations
start_slurm
if [ $# -eq 0 ]; then
    set -- "$repo/.venv/bin/python" -m pytest -p no:cacheprovider "$here" -v
fi
DPMED_SLURM_CLUSTER=1 "$@"
