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

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
