#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing, starts the
# project-local broker (or reuses a running one), builds with warnings as
# errors, runs the static checks (shellcheck, yamllint), the demo's
# non-interactive check, the deploy check (least-privilege users, TLS),
# every test, the browser, terminal, APNs and cluster tests, and short fuzz and chaos runs, and stops the broker it started even when tests fail.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/lint.sh
started=0
if ! bash scripts/broker.sh status; then
  bash scripts/broker.sh start
  started=1
fi
cleanup() { if [ "$started" = 1 ]; then bash scripts/broker.sh stop; fi; }
trap cleanup EXIT
eval "$(bash scripts/broker.sh env)"
swift build --build-tests -Xswiftc -warnings-as-errors
FRONTDESK_SWIFT_FLAGS="-Xswiftc -warnings-as-errors" bash scripts/demo.sh --check
bash scripts/check-deploy.sh
# Each service the Swift tests start logs (info and up) into a file of its
# own, named by its test's vhost; after a failure their warnings and errors
# are shown.
test_logs=$(mktemp -d)
if ! FRONTDESK_TEST_LOG_DIR="$test_logs" FRONTDESK_TEST_LOG_LEVEL=info swift test -Xswiftc -warnings-as-errors; then
  echo "test.sh: a test failed; the services' warnings and errors follow (their whole logs: $test_logs)"
  grep -H '"level":"\(warning\|error\)"' "$test_logs"/*.log | sed "s|^$test_logs/||" | tail -n 1500 || true
  exit 1
fi
rm -rf "$test_logs"
# The web Live Activity in headless Chromium against the real services.
python3 Tests/Browser/live_activity_test.py
# frontdesk dispatch on a pseudo-terminal: redraw, keys, Ctrl-C.
python3 Tests/Terminal/dispatch_tty_test.py
# frontdesk-pusher against an HTTP/2 APNs stand-in over TLS.
python3 Tests/Pusher/pusher_test.py
# On a local 3-node cluster: kill -9 a node mid-run, bring it back, kill another.
FRONTDESK_TEST_LOG_LEVEL=info python3 Tests/Cluster/cluster_test.py --dispatches 900 --rate 30
# The same with the sender split into 4 partitions, growing from 1 to 2 to 4 replicas mid-run.
FRONTDESK_TEST_LOG_LEVEL=info python3 Tests/Cluster/cluster_test.py --dispatches 900 --rate 30 --partitions 4 --senders 1,2,4
# Short versions of the evidence runs (the full ones: README, Reliability).
python3 scripts/evidence/fuzz.py --count 1000 --timeout 120
python3 scripts/evidence/chaos.py --dispatches 1000 --rate 100 --timeout 240
