#!/usr/bin/env bash
# The README's run command: install what the proxy needs, then start a local Kafka and
# the proxy in front of it (`tierproxy dev`). Ctrl-C stops everything. The data (Kafka's,
# the WAL, the objects, the proxy's config) stays in .data/ for the next run;
# `make run ARGS=--fresh` starts empty.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/tierproxy dev --data-dir "$PWD/.data" "$@"
