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
command -v python3 >/dev/null || { echo "publish.sh: python3 is missing (it encodes the JSON body)" >&2; exit 1; }
prefix="sh-$(date +%s)-$$"
# The body, encoded by a JSON encoder: any text (quotes, backslashes,
# newlines, control characters) arrives unchanged.
body() {
  ID="$1" TEXT="$text" python3 -c 'import json, os, datetime
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
print(json.dumps({"id": os.environ["ID"], "input": os.environ["TEXT"], "createdAt": now}, ensure_ascii=False))'
}
for n in $(seq 1 "$count"); do
  id="$prefix-$n"
  amqp-publish --url="$url" --exchange=frontdesk.commands --routing-key=dispatch.request \
    --content-type=application/json --persistent \
    --body="$(body "$id")"
  echo "$id"
done
