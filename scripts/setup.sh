#!/usr/bin/env bash
# Installs everything tierproxy needs on a fresh machine, into ignored folders:
#   .venv/                 Python packages: proxy, offload jobs, dev tools (constraints.txt)
#   .cache/kafka-<v>/libs  Apache Kafka's jars from Maven Central
#   .cache/kafka-<v>/streams-libs  Kafka Streams' jar and RocksDB's, from Maven Central
#   .cache/bin/minio       MinIO built from source at a pinned version (with --minio)
#   .cache/bin/toxiproxy-server  Toxiproxy built from source at a pinned version (--toxiproxy)
# Each step is skipped when its stamp says it is already done, so second runs are fast.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${TIERPROXY_CACHE:-$root/.cache}
# shellcheck source=../proxy/devstack/versions.env
source proxy/devstack/versions.env
want_minio=0
want_toxiproxy=0
for arg in "$@"; do
  case $arg in
    --minio) want_minio=1 ;;
    --toxiproxy) want_toxiproxy=1 ;;
    *) echo "setup.sh: unknown argument $arg (known: --minio, --toxiproxy)" >&2; exit 2 ;;
  esac
done
mkdir -p "$cache"
say() { printf '[setup] %s\n' "$*"; }

need() {  # need CMD DEBIAN_PACKAGE: install it with apt-get when missing and we are root
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing $2 for $1"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
  fi
  command -v "$1" >/dev/null 2>&1 || { echo "setup.sh: $1 is required (Debian package $2)" >&2; exit 1; }
}

# --- Python ----------------------------------------------------------------------------
python=${PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      python=$candidate; break
    fi
  done
fi
[ -n "$python" ] || { echo "setup.sh: Python >= 3.11 is required (set PYTHON=...)" >&2; exit 1; }
stamp_py=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.tierproxy-stamp 2>/dev/null)" != "$stamp_py" ]; then
  say "creating .venv with $($python --version) and installing packages (first time: a few minutes)"
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  # setuptools' note on editable installs is a warning pip shows; nothing to act on
  PYTHONWARNINGS="ignore:Editable installation" \
    .venv/bin/python -m pip install -q -c constraints.txt -e '.[dev,offload]'
  echo "$stamp_py" > .venv/.tierproxy-stamp
fi

# --- Apache Kafka jars -----------------------------------------------------------------
need java openjdk-17-jre-headless
need mvn maven
kafka_home=$cache/kafka-$KAFKA_VERSION
if [ ! -f "$kafka_home/.done" ]; then
  say "fetching Apache Kafka $KAFKA_VERSION jars from Maven Central into $kafka_home"
  rm -rf "$kafka_home/libs"
  # Maven's output (colour resets even in batch mode) goes to a log, shown only on failure
  if ! mvn -q -B --no-transfer-progress -Dstyle.color=never -f scripts/kafka/pom.xml \
    -Dmaven.repo.local="$cache/m2" \
    -Dkafka.version="$KAFKA_VERSION" -Dscala.binary.version="$SCALA_BINARY_VERSION" \
    dependency:copy-dependencies -DoutputDirectory="$kafka_home/libs" >"$cache/mvn.log" 2>&1; then
    cat "$cache/mvn.log" >&2
    echo "setup.sh: fetching Kafka's jars failed (log above, also in $cache/mvn.log)" >&2
    exit 1
  fi
  touch "$kafka_home/.done"
fi

# --- Kafka Streams jars (the exactly-once Streams test compiles an application on them) ---
streams_libs=$kafka_home/streams-libs
if [ ! -f "$streams_libs/.done" ]; then
  say "fetching Kafka Streams $KAFKA_VERSION jars from Maven Central into $streams_libs"
  rm -rf "$streams_libs"
  if ! mvn -q -B --no-transfer-progress -Dstyle.color=never -f scripts/kafka-streams/pom.xml \
    -Dmaven.repo.local="$cache/m2" -Dkafka.version="$KAFKA_VERSION" \
    dependency:copy-dependencies -DoutputDirectory="$streams_libs" >"$cache/mvn.log" 2>&1; then
    cat "$cache/mvn.log" >&2
    echo "setup.sh: fetching Kafka Streams' jars failed (log above, also in $cache/mvn.log)" >&2
    exit 1
  fi
  touch "$streams_libs/.done"
fi

# --- MinIO -----------------------------------------------------------------------------
if [ "$want_minio" = 1 ]; then
  minio_stamp=$cache/bin/.minio-$MINIO_VERSION
  if [ ! -x "$cache/bin/minio" ] || [ ! -f "$minio_stamp" ]; then
    need go golang-go
    say "building MinIO $MINIO_VERSION from source (first time: a few minutes)"
    mkdir -p "$cache/bin"
    GOBIN=$cache/bin GOPATH=$cache/go GOCACHE=$cache/go-build GOFLAGS=-modcacherw \
      CGO_ENABLED=0 GOTOOLCHAIN=local go install "$MINIO_MODULE@$MINIO_VERSION"
    rm -f "$cache"/bin/.minio-*
    touch "$minio_stamp"
  fi
fi

# --- Toxiproxy (the flaky-network tests put it between the proxies and MinIO) -------------
if [ "$want_toxiproxy" = 1 ]; then
  toxiproxy_stamp=$cache/bin/.toxiproxy-$TOXIPROXY_VERSION
  if [ ! -x "$cache/bin/toxiproxy-server" ] || [ ! -f "$toxiproxy_stamp" ]; then
    need go golang-go
    say "building Toxiproxy $TOXIPROXY_VERSION from source"
    mkdir -p "$cache/bin"
    # `go install` names the binary after its package folder (cmd/server): install it into
    # a folder of its own, then move it to its name
    gobin=$(mktemp -d "$cache/toxiproxy-build.XXXXXX")
    GOBIN=$gobin GOPATH=$cache/go GOCACHE=$cache/go-build GOFLAGS=-modcacherw \
      CGO_ENABLED=0 GOTOOLCHAIN=local go install "$TOXIPROXY_MODULE/cmd/server@$TOXIPROXY_VERSION"
    mv "$gobin/server" "$cache/bin/toxiproxy-server"
    rm -rf "$gobin"
    rm -f "$cache"/bin/.toxiproxy-*
    touch "$toxiproxy_stamp"
  fi
fi
say "ready"
