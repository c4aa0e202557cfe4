#!/bin/bash
# The compose stack for real with podman on a machine without a Docker
# engine (see deploy/README.md): builds the images, starts RabbitMQ, router,
# sender, gateway, pusher and agent, dispatches through the stack as the
# operator user and through the gateway with a bearer token and expects both
# replied, checks readiness, that the images run as non-root and that SIGTERM
# stops a service with exit status 0, then takes the stack down. A missing
# gateway token file or APNs key is made for the run (and removed after).
#
#   bash deploy/podman-e2e.sh        (WORK=/var/tmp/frontdesk-podman by default)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${WORK:-/var/tmp/frontdesk-podman}"
mkdir -p "$WORK"
printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' > "$WORK/containers.conf"
export CONTAINERS_CONF="$WORK/containers.conf"   # rlimits cannot be set here; crun fails on this cgroup setup
COMPOSE="${COMPOSE:-$WORK/venv/bin/podman-compose}"
if [ ! -x "$COMPOSE" ]; then
    python3 -m venv "$WORK/venv" && "$WORK/venv/bin/pip" install -q podman-compose==1.6.0
fi

# Base images made locally when no registry is reachable.
if ! podman image exists docker.io/library/debian:bookworm-slim; then
    mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)"
    debootstrap --variant=minbase bookworm "$WORK/rootfs" "$mirror" >/dev/null
    tar -C "$WORK/rootfs" -c . | podman import - docker.io/library/debian:bookworm-slim >/dev/null
fi
SWIFT_IMAGE="${SWIFT_IMAGE:-localhost/swift-toolchain:6.3.1-bookworm}"
if ! podman image exists "$SWIFT_IMAGE"; then
    rm -rf "$WORK/rootfs-swift" && mkdir -p "$WORK/rootfs-swift"
    [ -d "$WORK/rootfs" ] || debootstrap --variant=minbase bookworm "$WORK/rootfs" "$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)" >/dev/null
    cp -a "$WORK/rootfs/." "$WORK/rootfs-swift/"
    swift_root="$(dirname "$(dirname "$(dirname "$(readlink -f "$(command -v swift)")")")")"
    mkdir -p "$WORK/rootfs-swift/opt" && cp -a "$swift_root" "$WORK/rootfs-swift/opt/swift"
    tar -C "$WORK/rootfs-swift" -c . | podman import \
        --change "ENV PATH=/opt/swift/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" - "$SWIFT_IMAGE" >/dev/null
fi

echo "podman-e2e: building images"
start=$(date +%s)
podman build --format docker --network host --pull=never -f deploy/Containerfile --build-arg SWIFT_IMAGE="$SWIFT_IMAGE" -t localhost/frontdesk:latest . >"$WORK/build.log" 2>&1
podman build --format docker --network host --pull=never -f deploy/rabbitmq/Containerfile -t localhost/frontdesk-rabbitmq:3.10 deploy/rabbitmq >>"$WORK/build.log" 2>&1
echo "  built in $(( $(date +%s) - start )) s; frontdesk image $(podman image inspect localhost/frontdesk:latest --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}')"

# Credentials for this run only.
ENV_FILE=deploy/.env
created_env=0
if [ ! -f "$ENV_FILE" ]; then
    created_env=1
    sed -E "s/=change-me-.*/=$(openssl rand -hex 8)/" deploy/.env.example > "$ENV_FILE"
    sed -i "s|^RABBITMQ_IMAGE=.*|RABBITMQ_IMAGE=localhost/frontdesk-rabbitmq:3.10|" "$ENV_FILE"
fi
set -a
# shellcheck source=/dev/null
source "$ENV_FILE"
set +a
compose() { "$COMPOSE" -f deploy/compose.yaml --env-file "$ENV_FILE" "$@"; }
# The gateway's tokens and the pusher's key, for this run only if none are there.
TOKEN="$(openssl rand -hex 16)"
created_tokens=0
if [ ! -f deploy/gateway-tokens.json ]; then
    created_tokens=1
    printf '{"%s":"u-e2e"}' "$(printf %s "$TOKEN" | sha256sum | cut -d' ' -f1)" > deploy/gateway-tokens.json
fi
created_key=0
if [ ! -f deploy/apns/AuthKey.p8 ]; then
    created_key=1
    mkdir -p deploy/apns
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out deploy/apns/AuthKey.p8 2>/dev/null
    chmod 644 deploy/apns/AuthKey.p8  # read by the image's user
fi
down() {
    compose down -v >/dev/null 2>&1 || true
    [ "$created_env" = 1 ] && rm -f "$ENV_FILE"
    [ "$created_tokens" = 1 ] && rm -f deploy/gateway-tokens.json
    [ "$created_key" = 1 ] && rm -rf deploy/apns
    return 0
}
trap down EXIT

echo "podman-e2e: compose up"
start=$(date +%s)
compose up -d >"$WORK/up.log" 2>&1
# podman 4.3 runs no "service_healthy" start order (podman-compose warns and
# starts everything at once); the services retry the broker with backoff.
# Without systemd podman schedules no health checks: run each one by hand.
health() { podman healthcheck run "frontdesk_$1_1" >/dev/null 2>&1 && echo healthy || echo unhealthy; }
for _ in $(seq 1 120); do
    all=1
    for c in rabbitmq router sender gateway pusher; do [ "$(health "$c")" = healthy ] || all=0; done
    [ "$all" = 1 ] && break
    sleep 1
done
for c in rabbitmq router sender gateway pusher; do
    echo "  frontdesk_${c}_1: $(health "$c")"
done
echo "  frontdesk_agent_1 running: $(podman inspect frontdesk_agent_1 --format '{{.State.Running}}'); stack up in $(( $(date +%s) - start )) s"
echo "  router runs as uid $(podman exec frontdesk_router_1 id -u)"

echo "podman-e2e: dispatch through the stack as the operator user"
# The URL with its password goes in through the environment, never in a command's arguments.
if AMQP_URL="amqp://operator:$OPERATOR_PASSWORD@127.0.0.1:5672/frontdesk" \
    podman run --rm --network host --health-cmd none --env AMQP_URL localhost/frontdesk:latest frontdesk dispatch --json --id podman-e2e-1 \
    "Reply to Lisa about the AGM agenda — short, confirm 14:00" >"$WORK/dispatch.out" 2>"$WORK/dispatch.log"; then
    echo "  $(grep -c . "$WORK/dispatch.out") events; last: $(tail -n1 "$WORK/dispatch.out" | grep -o '"state":"[a-z]*"') $(tail -n1 "$WORK/dispatch.out" | grep -o '"project":{[^}]*}' | grep -o '"name":"[^"]*"')"
else
    echo "podman-e2e: FAILED: the dispatch did not end replied"; cat "$WORK/dispatch.out"; exit 1
fi

echo "podman-e2e: a dispatch through the gateway with a bearer token"
if [ "$created_tokens" = 1 ]; then
    # 503 until the gateway has read the status log: posted again until taken (same id, same dispatch).
    posted=""
    for _ in $(seq 1 100); do
        posted="$(curl -s -w ' %{http_code}' -H "Authorization: Bearer $TOKEN" \
            -d '{"id":"podman-e2e-2","input":"Reply to Lisa about the AGM agenda"}' http://127.0.0.1:8080/v1/dispatches || true)"
        [ "${posted##* }" = 202 ] && break
        sleep 0.2
    done
    echo "  posted: ${posted##* }"
    state=none
    for _ in $(seq 1 100); do
        state="$(curl -fs -H "Authorization: Bearer $TOKEN" http://127.0.0.1:8080/v1/dispatches/podman-e2e-2 \
            | python3 -c 'import json, sys; print(json.load(sys.stdin)["state"])' 2>/dev/null || echo none)"
        [ "$state" = replied ] && break
        sleep 0.2
    done
    echo "  state: $state"
    if [ "$state" != replied ]; then
        echo "podman-e2e: FAILED: the gateway's dispatch did not end replied (POST answered: $posted)"
        podman logs frontdesk_gateway_1 2>&1 | tail -n 5
        exit 1
    fi
else
    echo "  skipped: deploy/gateway-tokens.json is yours, and its tokens are not known here"
fi

echo "podman-e2e: readiness as the services report it"
for pair in router:9101 sender:9102 gateway:9103 pusher:9104; do
    code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${pair#*:}/readyz" || true)"
    echo "  ${pair%%:*} /readyz: $code"
    [ "$code" = 200 ] || { echo "podman-e2e: FAILED: ${pair%%:*} is not ready"; exit 1; }
done

echo "podman-e2e: SIGTERM reaches PID 1"
podman stop --time 20 frontdesk_sender_1 >/dev/null 2>&1
code="$(podman inspect frontdesk_sender_1 --format '{{.State.ExitCode}}')"
echo "  sender exit status after podman stop: $code"
[ "$code" = 0 ] || { echo "podman-e2e: FAILED: exit status $code"; exit 1; }
podman stop --time 60 frontdesk_rabbitmq_1 >/dev/null 2>&1
echo "  rabbitmq exit status after podman stop: $(podman inspect frontdesk_rabbitmq_1 --format '{{.State.ExitCode}}')"
echo "podman-e2e: passed"
