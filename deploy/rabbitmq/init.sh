#!/bin/bash
# Starts RabbitMQ, then gives each role's user its password from the
# environment (deploy/.env), so that no secret is committed. Marks readiness
# for the health check once the users can log in. SIGTERM stops the broker.
set -euo pipefail

rabbitmq-server &
broker=$!
trap 'rabbitmqctl stop >/dev/null 2>&1 || true; wait "$broker"; exit 0' TERM INT

# The node registers with epmd a few seconds after it starts; until then
# await_startup fails at once, so ask again.
for _ in $(seq 1 120); do
    rabbitmqctl -q await_startup --timeout 120 >/dev/null 2>&1 && break
    kill -0 "$broker" 2>/dev/null || { echo "init.sh: rabbitmq-server exited" >&2; exit 1; }
    sleep 1
done
for role in admin router sender producer operator agent surface gateway pusher; do
    variable="$(echo "$role" | tr '[:lower:]' '[:upper:]')_PASSWORD"
    [ "$role" = admin ] && variable=RABBITMQ_ADMIN_PASSWORD
    password="${!variable:-}"
    if [ -z "$password" ]; then
        echo "init.sh: $variable is not set; user $role cannot log in" >&2
        continue
    fi
    rabbitmqctl change_password "$role" "$password" >/dev/null
done
touch /tmp/frontdesk-users-ready
wait "$broker"
