#!/usr/bin/env bash
# Installs the Debian packages the project needs, only when one is missing.
set -euo pipefail
needed=(gdb librabbitmq-dev libmicrohttpd-dev libssl-dev libcurl4-openssl-dev rabbitmq-server openssl curl amqp-tools shellcheck yamllint chromium chromium-driver)
missing=()
for p in "${needed[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  # Debian starts the system broker after installing it; ours runs apart, so stop that one.
  $SUDO service rabbitmq-server stop >/dev/null 2>&1 || true
fi
# pika, for the Python producer script and its test.
python3 -c "import pika" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check pika >&2 \
  || echo "install-deps: could not install pika; deploy/producers/publish.py will not run" >&2
# h2 and cryptography, for the APNs stand-in of the pusher's test.
python3 -c "import h2, cryptography" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check h2 cryptography >&2 \
  || echo "install-deps: could not install h2 and cryptography; Tests/Pusher/pusher_test.py will not run" >&2
command -v swift >/dev/null || { echo "install-deps: the Swift toolchain (6.x) is not on PATH" >&2; exit 1; }
