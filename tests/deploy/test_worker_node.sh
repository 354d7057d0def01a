#!/usr/bin/env bash
# deploy/docker/pcs-worker-node as the GPU overlay runs it (here on CPU workers): N pcs-workers in
# one pod, each with its own identity and metrics port; the probe passes only when every worker
# does; a worker that dies ends the pod (the others are stopped); SIGTERM stops them all
# cleanly (exit 0, every worker deregistered). Real coordinator and workers on 127.0.0.1.
# usage: test_worker_node.sh BIN_DIR SOURCE_DIR
set -u
bin=$1
src=$2
node=$src/deploy/docker/pcs-worker-node
dir=$(mktemp -d "${TMPDIR:-/tmp}/pcs-worker-node.XXXXXX")
coord=
launcher=
cleanup() {
  [ -n "$launcher" ] && kill -KILL "$launcher" 2>/dev/null
  pkill -KILL -f -- "--identity wn-$$-" 2>/dev/null
  [ -n "$coord" ] && { kill -KILL "$coord"; wait "$coord"; } 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.log; do echo "--- $f"; tail -n 20 "$f"; done
  exit 1
}

# two free consecutive ports for the workers' metrics
base=$(/usr/bin/python3 -c '
import socket
for p in range(21000, 60000, 7):
    s = [socket.socket() for _ in range(2)]
    try:
        [x.bind(("127.0.0.1", p + i)) for i, x in enumerate(s)]
        print(p); break
    except OSError:
        pass
    finally:
        [x.close() for x in s]
')
export PCS_LOCAL_WORKERS=2 PCS_METRICS_BASE_PORT=$base PCS_WORKER_BIN=$bin/pcs-worker
export PCS_IDENTITY=wn-$$

"$bin/pcs-coordinator" --listen 127.0.0.1:0 --port-file "$dir/port" --lease-ms 3000 \
  >"$dir/coord.log" 2>&1 &
coord=$!
for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
[ -s "$dir/port" ] || fail "coordinator did not start"
addr=127.0.0.1:$(cat "$dir/port")

# nothing listens yet: the probe fails and says which worker
out=$("$node" --probe /healthz) && fail "probe passed with no workers"
echo "$out" | grep -q "worker 0: nothing listens on port $base" || fail "probe said: $out"

start_node() {
  "$node" --coordinator "$addr" --heartbeat-interval-ms 300 >"$dir/node$1.log" 2>&1 &
  launcher=$!
  for _ in $(seq 200); do "$node" --probe /readyz >/dev/null && return 0; sleep 0.1; done
  fail "the node's workers never became ready: $("$node" --probe /readyz)"
}

# 1. both workers register under <identity>-<i>; the probe passes for both
start_node 1
ws=$("$bin/pcsctl" --coordinator "$addr" workers)
echo "$ws" | grep -q "wn-$$-0" || fail "no worker wn-$$-0 in: $ws"
echo "$ws" | grep -q "wn-$$-1" || fail "no worker wn-$$-1 in: $ws"
"$node" --probe /healthz >/dev/null || fail "liveness probe failed"

# 2. worker 1 dies: the pod ends with a failure and worker 0 is stopped too
victim=$(pgrep -f -- "--identity wn-$$-1")
[ -n "$victim" ] || fail "no process for wn-$$-1"
kill -KILL "$victim"
for _ in $(seq 100); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
kill -0 "$launcher" 2>/dev/null && fail "the node did not end when a worker died"
wait "$launcher"
rc=$?
[ "$rc" -ne 0 ] || fail "the node exited 0 after a worker was killed"
pgrep -f -- "--identity wn-$$-0" >/dev/null && fail "worker 0 still runs after the node ended"
grep -q "a worker ended" "$dir/node1.log" || fail "the node did not say why it ended"
launcher=

# 3. a fresh node, then SIGTERM: exit 0, both workers deregistered (GONE)
sleep 3.5 # the killed worker's identity is held until its lease (3 s) lapses
start_node 2
kill -TERM "$launcher"
for _ in $(seq 150); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
kill -0 "$launcher" 2>/dev/null && fail "the node did not stop on SIGTERM"
wait "$launcher"
rc=$?
launcher=
[ "$rc" -eq 0 ] || fail "SIGTERM: the node exited $rc"
pgrep -f -- "--identity wn-$$-" >/dev/null && fail "workers still run after SIGTERM"
ws=$("$bin/pcsctl" --coordinator "$addr" workers --state gone)
for i in 0 1; do
  echo "$ws" | grep -q "wn-$$-$i" || fail "wn-$$-$i did not deregister: $ws"
done
echo "ok: pcs-worker-node starts, probes, fails and stops its workers as one pod"
