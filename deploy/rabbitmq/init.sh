#!/bin/bash
# Starts RabbitMQ, then gives each role's user its password from the
# environment (deploy/.env), so that no secret is committed. Marks readiness
# for the health check once the users can log in. SIGTERM stops the broker.
set -euo pipefail

# Ready only once this start has set the passwords (a restarted container keeps its /tmp).
rm -f /tmp/frontdesk-users-ready
if [ -n "${FRONTDESK_CLUSTER_SIZE:-}" ]; then
    # Before the node starts: no moment with a published cookie.
    case "${RABBITMQ_ERLANG_COOKIE:-}" in
        ""|change-me*) echo "init.sh: set FRONTDESK_ERLANG_COOKIE in deploy/.env to a long random secret" >&2; exit 1 ;;
    esac
fi

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
# In a cluster (compose.cluster.yaml): FRONTDESK_JOIN names the node this one
# joins (once; its data then remembers), FRONTDESK_CLUSTER_SIZE how many must
# run before anything is declared, and the node with
# FRONTDESK_IMPORTS_DEFINITIONS=1 imports the definitions and sets the
# passwords then, so that every quorum queue and stream of the topology gets
# a replica on each node. A single broker loads the definitions at boot.
if [ "${FRONTDESK_IMPORTS_DEFINITIONS:-}" = 1 ]; then
    # Booted without definitions, RabbitMQ made its guest/guest administrator:
    # not kept (host networking makes "loopback only" any process on the host).
    rabbitmqctl -q delete_user guest >/dev/null 2>&1 || true
fi
# Captured, then searched: `grep -q` ending a pipe early could fail the pipe
# (pipefail) and send an already joined node through reset.
# A status that cannot be read joins nothing: a reset would wipe a member's data.
if [ -n "${FRONTDESK_JOIN:-}" ] && members="$(rabbitmqctl -q cluster_status 2>/dev/null)" && ! grep -qF "$FRONTDESK_JOIN" <<<"$members"; then
    rabbitmqctl -q stop_app
    rabbitmqctl -q reset
    until out="$(rabbitmqctl -q join_cluster "$FRONTDESK_JOIN" 2>&1)"; do
        echo "init.sh: cannot join $FRONTDESK_JOIN yet: $out" >&2
        # A node whose data was wiped is still a member in the other's eyes: forgotten, then joined.
        if grep -q inconsistent_cluster <<<"$out"; then
            rabbitmqctl -q -n "$FRONTDESK_JOIN" forget_cluster_node "$RABBITMQ_NODENAME" >&2 || true
        fi
        sleep 2
    done
    rabbitmqctl -q start_app
    # Forgotten, it lost its quorum queue replicas: back on this node (queues that have one are skipped).
    rabbitmq-queues -q grow "$RABBITMQ_NODENAME" all >&2 || true
fi
if [ -n "${FRONTDESK_CLUSTER_SIZE:-}" ]; then
    running_nodes() { rabbitmqctl -q eval 'length(rabbit_nodes:all_running()).' 2>/dev/null || echo 0; }
    until [ "$(running_nodes)" -ge "$FRONTDESK_CLUSTER_SIZE" ]; do sleep 2; done
    if [ "${FRONTDESK_IMPORTS_DEFINITIONS:-}" != 1 ]; then
        # The users are the cluster's: node 1 sets them; this node is ready once it has joined.
        touch /tmp/frontdesk-users-ready
        wait "$broker"
        exit 0
    fi
    # Once, on the cluster's first start: an import empties the users' passwords
    # (the file has none) until they are set below, which a restart need not do.
    users="$(rabbitmqctl --silent list_users 2>/dev/null | awk '{print $1}' || true)"
    if ! grep -qx router <<<"$users"; then
        rabbitmqctl -q import_definitions /etc/rabbitmq/definitions.json
    fi
fi
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
