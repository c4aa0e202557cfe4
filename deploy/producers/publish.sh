#!/usr/bin/env bash
# Publishes dispatch requests with amqp-tools' amqp-publish (apt-get install amqp-tools).
#
#   deploy/producers/publish.sh "text" [COUNT]
#
# AMQP_URL as for the services (default amqp://guest:guest@127.0.0.1:5672/%2f).
# Each request gets a fresh id; with COUNT > 1, a burst with ids "<prefix>-<n>".
set -euo pipefail
text=${1:?usage: publish.sh "text" [COUNT]}
count=${2:-1}
url=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}
command -v amqp-publish >/dev/null || { echo "publish.sh: amqp-publish is missing (apt-get install amqp-tools)" >&2; exit 1; }
prefix="sh-$(date +%s)-$$"
escaped=$(printf '%s' "$text" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')
for n in $(seq 1 "$count"); do
  id="$prefix-$n"
  amqp-publish --url="$url" --exchange=frontdesk.commands --routing-key=dispatch.request \
    --content-type=application/json --persistent \
    --body="{\"id\":\"$id\",\"input\":\"$escaped\",\"createdAt\":\"$(date -u +%Y-%m-%dT%H:%M:%S.000Z)\"}"
  echo "$id"
done
