#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, for tests/test_slurm.py and for trying
# `launcher=slurm` without a cluster:
#
#   sudo bash scripts/slurm/cluster.sh start    # install if missing, start, wait until the node is idle
#   sudo bash scripts/slurm/cluster.sh status   # daemons and `sinfo`; exit 0 when the node takes jobs
#   sudo bash scripts/slurm/cluster.sh stop     # cancel jobs, stop every daemon, delete the state
#
# Debian's packages (slurm-wlm 22.05, slurmdbd, munge, mariadb-server) are installed with apt when
# missing. Every daemon runs as root, started directly (containers have no systemd), with its
# state, logs and sockets under $KBENCH_SLURM_DIR (default /tmp/kbench-slurm): munged (on its
# default socket, unless one already serves it), a private MariaDB for slurmdbd (submitit reads job states through sacct), slurmctld and
# slurmd. Clients find the cluster through SLURM_CONF=$KBENCH_SLURM_DIR/slurm.conf; where
# /etc/slurm/slurm.conf does not exist, `start` links it there so plain `sinfo` works too.
#
# Settings (environment): KBENCH_SLURM_DIR, KBENCH_SLURM_PARTITION (default debug),
# KBENCH_SLURM_PORT (slurmctld; slurmd and slurmdbd take the next two; default 6817),
# KBENCH_SLURM_DB_PORT (MariaDB, default 3316), KBENCH_SLURM_TIMEOUT (seconds per wait, default 60).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${KBENCH_SLURM_DIR:-/tmp/kbench-slurm}"
PARTITION="${KBENCH_SLURM_PARTITION:-debug}"
CTLD_PORT="${KBENCH_SLURM_PORT:-6817}"
SLURMD_PORT=$((CTLD_PORT + 1))
DBD_PORT=$((CTLD_PORT + 2))
DB_PORT="${KBENCH_SLURM_DB_PORT:-3316}"
TIMEOUT="${KBENCH_SLURM_TIMEOUT:-60}"
HOST="$(hostname -s)"
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server)
COMMANDS=(slurmctld slurmd slurmdbd sinfo sbatch sacct sacctmgr scontrol munged mungekey mariadbd mariadb-install-db mariadb-admin)
SYSTEM_CONF=/etc/slurm/slurm.conf

export SLURM_CONF="$DIR/slurm.conf"

say() { echo "slurm-cluster: $*"; }
die() { echo "slurm-cluster: error: $*" >&2; exit "${2:-1}"; }

# wait_for <what> <command...>: retry the command every half second, up to TIMEOUT seconds.
wait_for() {
  local what="$1"; shift
  local deadline=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      say "$what not ready after ${TIMEOUT}s; the logs:"
      tail -n 20 "$DIR"/log/*.log >&2 2>/dev/null || true
      die "$what did not start"
    fi
    sleep 0.5
  done
}

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_packages() {
  local missing=()
  for c in "${COMMANDS[@]}"; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "$c" >/dev/null || missing+=("$c")
  done
  ((${#missing[@]} == 0)) && return
  ((EUID == 0)) || die "missing ${missing[*]}; installing them needs root: sudo bash $0 start" 2
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install ${PACKAGES[*]}" 2
  say "installing ${PACKAGES[*]} (missing: ${missing[*]})"
  apt-get update -q >/dev/null
  # policy-rc.d in containers stops the packages' services from starting; that is what we want.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null
}

render() {  # render <template> <output>
  sed -e "s|@DIR@|$DIR|g" -e "s|@HOST@|$HOST|g" -e "s|@PARTITION@|$PARTITION|g" \
      -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
      -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@DB_PORT@|$DB_PORT|g" -e "s|@NODE_LINE@|$NODE_LINE|g" \
      "$1" >"$2"
}

node_state() { timeout 10 sinfo -h -N -n "$HOST" -o %t 2>/dev/null | head -n 1; }
node_idle() { [[ "$(node_state)" == idle ]]; }
node_up() { [[ "$(node_state)" =~ ^(idle|mix|alloc)$ ]]; }

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  # A munged already serving the default socket (a host's own) is used as it is, and left running.
  if munge_works; then say "munged: using the one already running"; return; fi
  if [[ ! -s /etc/munge/munge.key ]]; then
    mkdir -p /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key
  fi
  mkdir -p /run/munge; chmod 755 /run/munge
  # --force: root owns everything here, where munged would rather run as the munge user.
  munged --force --pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munged.seed" 9>&-
  wait_for munged munge_works
}

start_database() {
  mariadb-install-db --no-defaults --datadir="$DIR/mysql" --user=root \
    --auth-root-authentication-method=normal --skip-test-db >"$DIR/log/mariadb-install.log" 2>&1 \
    || { tail -n 20 "$DIR/log/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
  # mariadbd stays in the foreground: setsid + & detaches it from this shell and its terminal.
  setsid mariadbd --no-defaults --datadir="$DIR/mysql" --user=root --bind-address=127.0.0.1 \
    --port="$DB_PORT" --socket="$DIR/mysql.sock" --pid-file="$DIR/mariadb.pid" \
    --log-error="$DIR/log/mariadb.log" --skip-name-resolve </dev/null >/dev/null 2>&1 9>&- &
  wait_for MariaDB mariadb-admin --no-defaults --socket="$DIR/mysql.sock" -uroot ping
}

start() {
  install_packages
  if alive "$DIR/slurmctld.pid" && node_up; then
    say "already running: node $HOST $(node_state) in partition $PARTITION (SLURM_CONF=$SLURM_CONF)"
    return
  fi
  ((EUID == 0)) || die "the daemons run as root: sudo bash $0 start" 2
  [[ -d "$DIR" ]] && stop_daemons  # a half-started earlier cluster
  rm -rf "$DIR"
  mkdir -p "$DIR/log" "$DIR/slurmctld" "$DIR/slurmd"
  # The node's real CPUs, sockets, cores and memory, as slurmd itself detects them.
  NODE_LINE="$(slurmd -C | head -n 1 | sed 's/^NodeName=//')"
  render "$HERE/slurm.conf.in" "$DIR/slurm.conf"
  render "$HERE/slurmdbd.conf.in" "$DIR/slurmdbd.conf"
  chmod 600 "$DIR/slurmdbd.conf"  # slurmdbd refuses a readable one (it may hold a DB password)
  if [[ ! -e "$SYSTEM_CONF" ]]; then
    mkdir -p "$(dirname "$SYSTEM_CONF")"
    ln -s "$DIR/slurm.conf" "$SYSTEM_CONF"
  fi

  start_munge
  start_database
  # Each daemon closes fd 9, the start/stop lock (see lock), which it would otherwise hold forever.
  slurmdbd 9>&-  # finds slurmdbd.conf beside $SLURM_CONF; daemonizes
  wait_for slurmdbd sacctmgr -n list cluster
  sacctmgr -i add cluster kbench >/dev/null
  slurmctld 9>&-
  wait_for slurmctld scontrol ping
  slurmd 9>&-
  wait_for "node $HOST idle" node_idle
  say "up: node $HOST ($NODE_LINE) idle in partition $PARTITION"
  say "clients: export SLURM_CONF=$SLURM_CONF"
}

stop_daemons() {
  if alive "$DIR/slurmctld.pid"; then
    scancel --full --quiet --user=root 2>/dev/null || true
    # Give the cancelled steps KillWait to end before the daemons that track them go away.
    local deadline=$((SECONDS + 15))
    while [[ -n "$(squeue -h -o %i 2>/dev/null)" ]] && ((SECONDS < deadline)); do sleep 0.5; done
  fi
  # The SLURM daemons first, then what they report to; each group stops in parallel.
  terminate slurmd.pid slurmctld.pid
  terminate slurmdbd.pid mariadb.pid munged.pid
}

terminate() {  # terminate <pidfile under $DIR>...: SIGTERM, up to 10 s, then SIGKILL
  local pids=() pidfile pid
  for pidfile in "$@"; do
    alive "$DIR/$pidfile" && pids+=("$(cat "$DIR/$pidfile")")
  done
  ((${#pids[@]})) || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "${pids[@]}" 2>/dev/null || break  # true while any of them lives
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
}

stop() {
  [[ -d "$DIR" ]] || { say "not running (no $DIR)"; return; }
  stop_daemons
  if [[ -L "$SYSTEM_CONF" && "$(readlink "$SYSTEM_CONF")" == "$DIR/slurm.conf" ]]; then
    rm -f "$SYSTEM_CONF"
  fi
  rm -rf "$DIR"
  say "stopped"
}

status() {
  # Without our slurm.conf, sinfo would go looking for a configless controller in DNS: say so now.
  [[ -f "$DIR/slurm.conf" ]] || { say "not running (no $DIR/slurm.conf)"; return 1; }
  local ok=0 name
  for name in munged slurmdbd slurmctld slurmd mariadb; do
    if alive "$DIR/$name.pid"; then
      say "$name: running (pid $(cat "$DIR/$name.pid"))"
    elif [[ $name == munged ]] && munge_works; then
      say "munged: running (not started here)"
    else
      say "$name: not running"; ok=1
    fi
  done
  ((ok == 0)) || return 1
  sinfo -N -l
  say "node $HOST: $(node_state); SLURM_CONF=$SLURM_CONF"
  node_up
}

# One start or stop at a time (pytest-xdist workers may each try): the lock sits beside $DIR,
# which stop deletes.
lock() { exec 9>"$DIR.lock"; flock -w $((TIMEOUT * 5)) 9 || die "another start/stop holds $DIR.lock"; }

case "${1:-}" in
  start) lock; start ;;
  stop) lock; stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
