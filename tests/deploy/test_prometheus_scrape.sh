#!/usr/bin/env bash
# A real Prometheus (Debian's 2.42) scrapes a real coordinator with the shipped alert rules
# loaded: the target is up under Prometheus's own `job` label (pcs's series carry job_id and never
# clash with it: no exported_job), the pcs series are queryable, every rule group loads healthy,
# and when the coordinator is killed `up` drops to 0 and PcsCoordinatorDown goes pending.
# Exits 77 without prometheus (or curl), unless PCS_REQUIRE_TOOLS=1.
# usage: test_prometheus_scrape.sh BIN_DIR SOURCE_DIR
set -u
bin=$1
src=$2
if ! command -v prometheus >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
  echo "missing: prometheus or curl (deploy/install-deps.sh installs them)"
  [ "${PCS_REQUIRE_TOOLS:-0}" = 1 ] && exit 1
  exit 77
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/pcs-prom.XXXXXX")
coord=
prom=
cleanup() {
  [ -n "$prom" ] && { kill -KILL "$prom"; wait "$prom"; } 2>/dev/null
  [ -n "$coord" ] && { kill -KILL "$coord"; wait "$coord"; } 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.log; do echo "--- $f"; tail -n 20 "$f"; done
  exit 1
}
wait_file() {
  for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done
  return 1
}

"$bin/pcs-coordinator" --listen 127.0.0.1:0 --port-file "$dir/port" --metrics-listen 127.0.0.1:0 \
  --metrics-port-file "$dir/mport" >"$dir/coord.log" 2>&1 &
coord=$!
wait_file "$dir/mport" || fail "coordinator did not start"
mport=$(cat "$dir/mport")
pport=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cp "$src/deploy/prometheus/alerts.yaml" "$dir/alerts.yaml"
cat >"$dir/prometheus.yml" <<CFG
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [alerts.yaml]
scrape_configs:
  - job_name: pcs-coordinator
    static_configs: [{targets: ["127.0.0.1:$mport"]}]
CFG
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
  --web.listen-address="127.0.0.1:$pport" >"$dir/prometheus.log" 2>&1 &
prom=$!
api=http://127.0.0.1:$pport/api/v1
query() { curl -sf --get "$api/query" --data-urlencode "query=$1"; }
# the first scrapes: up == 1 under Prometheus's job label
ok=
for _ in $(seq 300); do
  r=$(query 'up{job="pcs-coordinator"}' 2>/dev/null) &&
    echo "$r" | grep -q '"value":\[[0-9.]*,"1"\]' && { ok=1; break; }
  sleep 0.1
done
[ -n "$ok" ] || fail "Prometheus never saw the coordinator up: ${r:-no answer}"
r=$(query 'pcs_workers') || fail "query pcs_workers"
echo "$r" | grep -q '"state":"IDLE"' || fail "pcs_workers not scraped: $r"
echo "$r" | grep -q '"job":"pcs-coordinator"' || fail "pcs_workers lacks the scrape job label: $r"
r=$(query '{__name__=~"pcs_.*",exported_job!=""}') || fail "query exported_job"
echo "$r" | grep -q '"result":\[\]' || fail "a pcs series clashes with the job label: $r"
r=$(query 'process_resident_memory_bytes{job="pcs-coordinator"}')
echo "$r" | grep -q '"result":\[{' || fail "process metrics not scraped: $r"
# every rule loads and, once evaluated (every 1 s), is healthy
for _ in $(seq 100); do
  rules=$(curl -sf "$api/rules") || fail "rules API"
  echo "$rules" | grep -q '"health":"unknown"' || break
  sleep 0.1
done
for a in PcsCoordinatorDown PcsStoreNotWriting PcsJobStalled PcsStraggler PcsJobRestarting \
         PcsWorkersLost; do
  echo "$rules" | grep -q "\"name\":\"$a\"" || fail "rule $a not loaded: $rules"
done
echo "$rules" | grep -q '"health":"ok"' || fail "no rule evaluated: $rules"
echo "$rules" | grep -qE '"health":"(err|unknown)"' && fail "a rule is not healthy: $rules"

# the coordinator dies: up drops to 0 and the page is pending (it fires after 1m)
kill -KILL "$coord"
wait "$coord" 2>/dev/null
coord=
ok=
for _ in $(seq 300); do
  a=$(curl -sf "$api/alerts" 2>/dev/null) &&
    echo "$a" | grep -q '"alertname":"PcsCoordinatorDown"' &&
    echo "$a" | grep -q '"state":"pending"' && { ok=1; break; }
  sleep 0.1
done
[ -n "$ok" ] || fail "PcsCoordinatorDown did not go pending: ${a:-no answer}"
echo "ok: Prometheus scraped the coordinator, loaded every rule and raised PcsCoordinatorDown"
