#!/usr/bin/env bash
# The one-command demo: a local broker, frontdesk-router, frontdesk-sender and
# a reference agent; the seed request shown live to "replied"; then the
# offline path: the agent stops, a second request waits "queued" with its best
# guess, the agent comes back and it goes to "replied" with no action. Stops
# everything it started.
#
#   bash scripts/demo.sh           show it (the Live Activity on a terminal)
#   bash scripts/demo.sh --check   assert those outcomes, non-interactively (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
[ "${1:-}" = "--check" ] && check=1

bash scripts/install-deps.sh
work=$(mktemp -d)
started=0
pids=()
agent=""
cleanup() {
  trap - EXIT INT TERM
  if [ -n "$agent" ]; then kill "$agent" 2>/dev/null || true; fi
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$started" = 1 ]; then bash scripts/broker.sh stop; fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
fail() { echo "demo: $*" >&2; exit 1; }

if ! bash scripts/broker.sh status; then bash scripts/broker.sh start; started=1; fi
eval "$(bash scripts/broker.sh env)"
# A vhost of the demo's own, so earlier runs leave nothing behind.
vhost="frontdesk-demo-$$"
bash scripts/broker.sh ctl add_vhost "$vhost" >/dev/null
bash scripts/broker.sh ctl set_permissions -p "$vhost" guest '.*' '.*' '.*' >/dev/null
export AMQP_URL="amqp://guest:guest@127.0.0.1:${FRONTDESK_BROKER_PORT:-5682}/$vhost"
trap 'bash scripts/broker.sh ctl delete_vhost "$vhost" >/dev/null 2>&1 || true; cleanup' EXIT INT TERM

echo "demo: building" >&2
# FRONTDESK_SWIFT_FLAGS: the test script passes its own, so nothing is built twice.
read -r -a flags <<<"${FRONTDESK_SWIFT_FLAGS:-}"
swift build "${flags[@]}" --product frontdesk-router >/dev/null
swift build "${flags[@]}" --product frontdesk-sender >/dev/null
swift build "${flags[@]}" --product frontdesk >/dev/null
bin=$(swift build "${flags[@]}" --show-bin-path)
FRONTDESK_HTTP_PORT=19191 "$bin/frontdesk-router" 2>"$work/router.log" & pids+=($!)
FRONTDESK_HTTP_PORT=19192 "$bin/frontdesk-sender" 2>"$work/sender.log" & pids+=($!)
for _ in $(seq 1 100); do
  curl -sf localhost:19191/readyz >/dev/null && curl -sf localhost:19192/readyz >/dev/null && break
  sleep 0.2
done
curl -sf localhost:19192/readyz >/dev/null || fail "the services did not become ready"
start_agent() { "$bin/frontdesk" agent --target yemaya/board-prep --delay-ms 250 2>/dev/null & agent=$!; sleep 1; }

seed="Reply to Lisa about the AGM agenda — short, confirm 14:00"
if [ "$check" = 0 ]; then
  echo; echo "== 1. The seed request, live"; echo
  start_agent
  "$bin/frontdesk" dispatch "$seed" || true
  echo; echo "== 2. Offline: the agent stops; a second request waits with its best guess"; echo
  kill "$agent"; agent=""; sleep 1
  "$bin/frontdesk" dispatch "Send the board minutes to the trustees" &
  second=$!
  sleep 3
  echo; echo "== 3. The agent comes back: it goes to sending and replied with no action"; echo
  start_agent
  wait "$second" || true
  echo; echo "demo: done" >&2
  exit 0
fi

# --check: the same story, asserted from the JSON events.
start_agent
"$bin/frontdesk" dispatch "$seed" --json > "$work/seed.jsonl" || fail "the seed request did not end replied"
grep -q '"state":"routing"' "$work/seed.jsonl" || fail "no routing event for the seed request"
grep -q '"reason":"keywords: agm, agenda; contact: Lisa"' "$work/seed.jsonl" || fail "the seed request was not routed by its keywords"
tail -n 1 "$work/seed.jsonl" | grep -q '"state":"replied"' || fail "the seed request did not end replied"
kill "$agent"; agent=""; sleep 1
"$bin/frontdesk" dispatch "Send the board minutes to the trustees" --json > "$work/offline.jsonl" &
second=$!
for _ in $(seq 1 50); do grep -q '"state":"queued"' "$work/offline.jsonl" 2>/dev/null && break; sleep 0.2; done
grep -q '"reason":"agent_offline"' "$work/offline.jsonl" || fail "the second request did not wait queued (agent_offline)"
grep -q '"target":{"id":"board-prep"' "$work/offline.jsonl" || fail "the queued event did not show its best guess"
start_agent
wait "$second" || fail "the second request did not end replied after the agent came back"
tail -n 1 "$work/offline.jsonl" | grep -q '"state":"replied"' || fail "the second request did not end replied"
echo "demo check: ok — the seed request replied; offline, the second waited queued with its best guess, then replied by itself"
