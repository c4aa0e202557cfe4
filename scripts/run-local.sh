#!/usr/bin/env bash
# Runs frontdesk-router and frontdesk-sender (release builds) against the
# project-local broker until Ctrl-C, then stops them and the broker it started.
# Probes: router http://127.0.0.1:9101/readyz, sender http://127.0.0.1:9102/readyz.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
started=0
router=""
sender=""
stop() {
  trap - EXIT INT TERM
  if [ -n "$router$sender" ]; then
    kill -TERM $router $sender 2>/dev/null || true
    wait $router $sender 2>/dev/null || true
  fi
  if [ "$started" = 1 ]; then bash scripts/broker.sh stop; fi
  exit 0
}
# Set before anything starts, so Ctrl-C at any point stops what was started.
trap stop EXIT INT TERM
if ! bash scripts/broker.sh status; then bash scripts/broker.sh start; started=1; fi
eval "$(bash scripts/broker.sh env)"
swift build -c release --product frontdesk-router
swift build -c release --product frontdesk-sender
bin=$(swift build -c release --show-bin-path)
"$bin/frontdesk-router" & router=$!
"$bin/frontdesk-sender" & sender=$!
for _ in $(seq 1 50); do
  if curl -sf localhost:9101/readyz >/dev/null && curl -sf localhost:9102/readyz >/dev/null; then
    echo "run-local: router and sender are ready (AMQP_URL=$AMQP_URL); Ctrl-C stops them" >&2
    break
  fi
  sleep 0.2
done
wait "$router" "$sender"
