#!/usr/bin/env bash
# A project-local RabbitMQ from Debian's rabbitmq-server, apart from any system one:
# its own node name, ports and data folder, owned by the rabbitmq user.
#
#   scripts/broker.sh start    start it (or reuse the one that runs) and wait until ready
#   scripts/broker.sh stop     stop it
#   scripts/broker.sh restart  stop, then start (data kept)
#   scripts/broker.sh status   exit 0 while it runs
#   scripts/broker.sh env      print the variables that point a client at it
#   scripts/broker.sh ctl ...  run rabbitmqctl against it
#
# Ports (override with the variables): AMQP 5682, AMQPS 5681, Erlang distribution 25682.
set -euo pipefail

NODE=${FRONTDESK_BROKER_NODE:-frontdesk-local@localhost}
PORT=${FRONTDESK_BROKER_PORT:-5682}
TLS_PORT=${FRONTDESK_BROKER_TLS_PORT:-5681}
DIST_PORT=${FRONTDESK_BROKER_DIST_PORT:-25682}
# /var/tmp is traversable by the rabbitmq user wherever the repository lives.
BASE=${FRONTDESK_BROKER_DIR:-/var/tmp/frontdesk-broker}
CERTS="$BASE/certs"

log() { printf 'broker: %s\n' "$*" >&2; }

ctl() {
  RABBITMQ_NODENAME="$NODE" rabbitmqctl -n "$NODE" "$@"
}

running() {
  ctl status >/dev/null 2>&1
}

make_certs() {
  [ -f "$CERTS/server.pem" ] && return 0
  mkdir -p "$CERTS"
  local d="$CERTS"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=frontdesk-local-ca" \
    -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$d/server.ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -days 3650 -extfile "$d/server.ext" -out "$d/server.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=frontdesk-client" \
    -keyout "$d/client.key" -out "$d/client.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' > "$d/client.ext"
  openssl x509 -req -in "$d/client.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -days 3650 -extfile "$d/client.ext" -out "$d/client.pem" 2>/dev/null
  # A second, unrelated CA: a client that trusts only it must be refused.
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=frontdesk-wrong-ca" \
    -keyout "$d/wrong-ca.key" -out "$d/wrong-ca.pem" 2>/dev/null
  chmod 644 "$d"/*.pem "$d"/*.key
}

write_config() {
  cat > "$BASE/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$PORT
listeners.ssl.default = 127.0.0.1:$TLS_PORT
ssl_options.cacertfile = $CERTS/ca.pem
ssl_options.certfile = $CERTS/server.pem
ssl_options.keyfile = $CERTS/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
loopback_users = none
event_exchange.vhost = /
log.file.level = warning
log.console = false
CONF
  echo '[rabbitmq_event_exchange,rabbitmq_consistent_hash_exchange].' > "$BASE/enabled_plugins"
}

start() {
  if running; then
    log "reusing $NODE on port $PORT"
    return 0
  fi
  command -v rabbitmq-server >/dev/null || { log "rabbitmq-server is not installed (apt-get install rabbitmq-server)"; exit 1; }
  mkdir -p "$BASE/mnesia" "$BASE/log"
  make_certs
  write_config
  chown -R rabbitmq:rabbitmq "$BASE"
  log "starting $NODE (AMQP $PORT, AMQPS $TLS_PORT, data $BASE)"
  # The broker outlives this script: it must hold none of the caller's
  # descriptors (a caller waiting for EOF on a pipe would wait for ever).
  (
    for fd in /proc/self/fd/*; do
      n=${fd##*/}
      [ "$n" -gt 2 ] 2>/dev/null && eval "exec $n>&-" 2>/dev/null
    done
    exec env \
  RABBITMQ_NODENAME="$NODE" \
  RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
  RABBITMQ_NODE_PORT="$PORT" \
  RABBITMQ_DIST_PORT="$DIST_PORT" \
  RABBITMQ_CONFIG_FILE="$BASE/rabbitmq.conf" \
  RABBITMQ_ENABLED_PLUGINS_FILE="$BASE/enabled_plugins" \
  RABBITMQ_MNESIA_BASE="$BASE/mnesia" \
  RABBITMQ_LOG_BASE="$BASE/log" \
  RABBITMQ_PID_FILE="$BASE/pid" \
    setsid nohup rabbitmq-server > "$BASE/log/console.log" 2>&1 < /dev/null
  ) &
  local pid=$!
  for _ in $(seq 1 120); do
    if ctl await_startup --timeout 2 >/dev/null 2>&1; then
      log "ready"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      log "the broker exited during start-up; see $BASE/log"
      grep -E '\[error\]' "$BASE/log/console.log" | head -n 20 >&2 || true
      exit 1
    fi
    sleep 0.5
  done
  log "did not start within 60 s; see $BASE/log"
  tail -n 30 "$BASE/log/console.log" >&2 || true
  exit 1
}

stop() {
  if running; then
    ctl stop >/dev/null 2>&1 || true
    log "stopped $NODE"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  status) running ;;
  env)
    echo "export AMQP_URL=amqp://guest:guest@127.0.0.1:$PORT/%2f"
    echo "export FRONTDESK_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:$PORT/%2f"
    echo "export FRONTDESK_TEST_AMQPS_URL=amqps://guest:guest@localhost:$TLS_PORT/%2f"
    echo "export FRONTDESK_TEST_CERTS=$CERTS"
    echo "export FRONTDESK_BROKER_NODE=$NODE"
    ;;
  ctl) shift; ctl "$@" ;;
  *) echo "usage: $0 start|stop|restart|status|env|ctl ARGS" >&2; exit 2 ;;
esac
