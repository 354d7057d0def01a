#!/usr/bin/env bash
# Install every Debian 12 package pcs needs to build, test and run (idempotent: installs only what
# is missing, does nothing when all are present). Runs as root (or via sudo) on a fresh machine.
# CUDA 13 and NCCL are not Debian packages: they are used from /usr/local/cuda when present.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  libgrpc-dev                       # gRPC C core 1.51
  libprotobuf-c-dev protobuf-c-compiler
  protobuf-compiler                 # protoc, for the Python interop test's generated code
  libcmocka-dev
  libgloo-dev                       # CPU collectives (pulls libhiredis-dev, libibverbs-dev)
  libopenblas-dev                   # CPU GEMM for the built-in models
  libsqlite3-dev libmicrohttpd-dev libyaml-dev
  libssl-dev                        # SHA-256 of worker secrets (libcrypto; gRPC uses it too)
  python3 python3-grpcio python3-protobuf   # wire-compatibility test with a stock gRPC client
  curl procps openssl               # /metrics checks, pgrep/ps, test certificates
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# promtool (checks the /metrics exposition in a test) comes from Debian's prometheus package, but
# installing that package would also start a Prometheus server: take the one binary out of it.
promtool_missing=0
command -v promtool >/dev/null 2>&1 || promtool_missing=1

if [ ${#missing[@]} -eq 0 ] && [ $promtool_missing -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ $promtool_missing -eq 1 ]; then
  tmp=$(mktemp -d)
  if (cd "$tmp" && apt-get download -qq prometheus >/dev/null 2>&1); then
    dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
    $SUDO install -m 0755 "$tmp/x/usr/bin/promtool" /usr/local/bin/promtool
    echo "install-deps: promtool from Debian's prometheus package in /usr/local/bin"
  else
    echo "install-deps: could not download prometheus (promtool); the metrics format check skips"
  fi
  rm -rf "$tmp"
fi
