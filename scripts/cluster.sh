#!/usr/bin/env bash
# A local 3-node RabbitMQ cluster on one machine, from Debian's rabbitmq-server:
# nodes frontdesk-c1, -c2 and -c3 @localhost, each with its own ports and data
# folder (owned by the rabbitmq user, under /var/tmp), the same plugins as the
# single local broker. Quorum queues and streams declared once the cluster has
# formed are replicated over all three.
#
#   scripts/cluster.sh start        start the nodes that are down and join them (data kept)
#   scripts/cluster.sh stop         stop every node
#   scripts/cluster.sh kill NODE    kill -9 one node (1, 2 or 3)
#   scripts/cluster.sh status       exit 0 while all three run
#   scripts/cluster.sh env          print AMQP_URL with every node's address
#   scripts/cluster.sh ctl NODE ... rabbitmqctl against one node
#   scripts/cluster.sh streams NODE ... rabbitmq-streams against one node (e.g. stream_status -p VHOST NAME)
#   scripts/cluster.sh wipe         stop, and remove the data folders
#
# Ports: AMQP 5691–5693, Erlang distribution 25691–25693.
set -euo pipefail

BASE=${FRONTDESK_CLUSTER_DIR:-/var/tmp/frontdesk-cluster}
NODES=(1 2 3)

log() { printf 'cluster: %s\n' "$*" >&2; }
name() { echo "frontdesk-c$1@localhost"; }
port() { echo $((5690 + $1)); }
ctl() { local n=$1; shift; RABBITMQ_NODENAME="$(name "$n")" rabbitmqctl -n "$(name "$n")" "$@"; }
running() { ctl "$1" status >/dev/null 2>&1; }
# Debian installs no /usr/sbin wrapper for rabbitmq-streams: the generic one
# runs the tool its link is named after, as the rabbitmq user.
streams() {
  local n=$1; shift
  mkdir -p "$BASE/bin"
  ln -sf /usr/lib/rabbitmq/bin/rabbitmq-script-wrapper "$BASE/bin/rabbitmq-streams"
  RABBITMQ_NODENAME="$(name "$n")" "$BASE/bin/rabbitmq-streams" -n "$(name "$n")" "$@"
}

write_config() {
  local n=$1 dir="$BASE/node$1"
  mkdir -p "$dir/mnesia" "$dir/log"
  cat > "$dir/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$(port "$n")
loopback_users = none
event_exchange.vhost = /
log.file.level = warning
log.console = false
cluster_partition_handling = pause_minority
CONF
  echo '[rabbitmq_event_exchange,rabbitmq_consistent_hash_exchange].' > "$dir/enabled_plugins"
}

start_node() {
  local n=$1 dir="$BASE/node$1"
  if running "$n"; then return 0; fi
  # Running but not answering yet (busy booting): a second server of the same
  # name would give up and take the pid file with it.
  if [ -n "$(node_pid "$n")" ]; then return 0; fi
  write_config "$n"
  chown -R rabbitmq:rabbitmq "$BASE"
  log "starting $(name "$n") (AMQP $(port "$n"))"
  (
    for fd in /proc/self/fd/*; do
      k=${fd##*/}
      [ "$k" -gt 2 ] 2>/dev/null && eval "exec $k>&-" 2>/dev/null
    done
    exec env \
      RABBITMQ_NODENAME="$(name "$n")" \
      RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
      RABBITMQ_NODE_PORT="$(port "$n")" \
      RABBITMQ_DIST_PORT=$((25690 + n)) \
      RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
      RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
      RABBITMQ_MNESIA_BASE="$dir/mnesia" \
      RABBITMQ_LOG_BASE="$dir/log" \
      RABBITMQ_PID_FILE="$dir/pid" \
      setsid nohup rabbitmq-server > "$dir/log/console.log" 2>&1 < /dev/null
  ) &
}

await_node() {
  local n=$1
  for _ in $(seq 1 120); do
    ctl "$n" await_startup --timeout 2 >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  log "$(name "$n") did not start within 60 s; see $BASE/node$n/log"
  exit 1
}

member() {  # member N: node N is in node 1's cluster
  ctl 1 cluster_status --formatter json 2>/dev/null | python3 -c \
    "import json, sys; print('yes' if '$(name "$1")' in json.load(sys.stdin).get('disk_nodes', []) else 'no')" 2>/dev/null | grep -q yes
}

start() {
  command -v rabbitmq-server >/dev/null || { log "rabbitmq-server is not installed"; exit 1; }
  for n in "${NODES[@]}"; do start_node "$n"; done
  for n in "${NODES[@]}"; do await_node "$n"; done
  for n in 2 3; do
    if ! member "$n"; then
      log "joining $(name "$n") to $(name 1)"
      ctl "$n" stop_app >/dev/null 2>&1
      ctl "$n" reset >/dev/null 2>&1
      ctl "$n" join_cluster "$(name 1)" >/dev/null 2>&1
      ctl "$n" start_app >/dev/null 2>&1
    fi
  done
  log "ready: $(name 1), $(name 2), $(name 3)"
}

stop() {
  local n pid
  for n in "${NODES[@]}"; do
    if running "$n"; then ctl "$n" stop >/dev/null 2>&1 || true; log "stopped $(name "$n")"; fi
    # A VM whose rabbit app is not running (still booting, or waiting for
    # its peers' tables once they stopped) fails the status check above and
    # lingered, holding its ports: asked to stop, then killed after 10 s.
    pid="$(node_pid "$n")"
    [ -n "$pid" ] || continue
    RABBITMQ_NODENAME="$(name "$n")" timeout 15 rabbitmqctl -n "$(name "$n")" stop >/dev/null 2>&1 || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    log "stopped $(name "$n") (its VM without the rabbit app)"
  done
}

# The pid of node N's server VM, found by the pid file named in its
# environment, which only start_node sets (rabbitmqctl's VMs name the node
# too; 3.10's command line does not name it; and the pid file itself goes
# when a second start of a running node gives up), or nothing.
node_pid() {
  local n=$1 pid
  for pid in $(pgrep -x beam.smp || true); do
    if grep -qzxF "RABBITMQ_PID_FILE=$BASE/node$n/pid" "/proc/$pid/environ" 2>/dev/null; then
      echo "$pid"
      return 0
    fi
  done
}

kill_node() {
  local n=$1
  [[ " ${NODES[*]} " == *" $n "* ]] || { echo "usage: $0 kill 1|2|3" >&2; exit 2; }
  local pid
  pid="$(node_pid "$n")"
  [ -n "$pid" ] || { log "$(name "$n") does not run"; exit 1; }
  kill -9 "$pid" 2>/dev/null || true  # (gone already: the wait below says so)
  # Gone before this returns: whoever asked for the kill may count on it.
  for _ in $(seq 1 100); do
    # (A zombie, not reaped yet where pid 1 does not reap, counts as gone.)
    if ! kill -0 "$pid" 2>/dev/null || [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ]; then
      log "killed $(name "$n") (pid $pid)"
      return 0
    fi
    sleep 0.05
  done
  log "$(name "$n") (pid $pid) still runs after kill -9"
  exit 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  kill) kill_node "${2:-}" ;;
  status) for n in "${NODES[@]}"; do running "$n" || exit 1; done ;;
  env) echo "export AMQP_URL=$(printf 'amqp://guest:guest@127.0.0.1:%s/%%2f,' 5691 5692 5693 | sed 's/,$//')" ;;
  ctl) n=${2:-}; shift 2; ctl "$n" "$@" ;;
  streams) n=${2:-}; shift 2; streams "$n" "$@" ;;
  wipe) stop; rm -rf "$BASE" ;;
  *) echo "usage: $0 start|stop|kill NODE|status|env|ctl NODE ARGS|streams NODE ARGS|wipe" >&2; exit 2 ;;
esac
