#!/bin/bash
# The quick static checks CI runs: shellcheck on every shell script, yamllint
# on every YAML file (compose, Kubernetes), and JSON syntax of the broker
# definitions and routing tables.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t scripts < <(git ls-files '*.sh' .ci/run)
shellcheck "${scripts[@]}"
echo "lint: shellcheck clean on ${#scripts[@]} scripts"
mapfile -t yamls < <(git ls-files '*.yaml' '*.yml')
yamllint -s -c .yamllint.yaml "${yamls[@]}"
echo "lint: yamllint clean on ${#yamls[@]} files"
mapfile -t jsons < <(git ls-files '*.json')
for f in "${jsons[@]}"; do python3 -m json.tool "$f" >/dev/null || { echo "lint: $f is not valid JSON"; exit 1; }; done
echo "lint: ${#jsons[@]} JSON files parse"
