#!/usr/bin/env bash
# The README's run command: install what the proxy needs, then start a local Kafka and
# the proxy in front of it (`tierproxy dev`). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/tierproxy dev "$@"
