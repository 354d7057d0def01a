#!/usr/bin/env bash
# `cmake --install` as a user meets it: into a fresh prefix it puts the programs, libpcs_worker.so
# (exporting only the C API), its headers, a pkg-config file, a CMake package, the protos and the
# descriptor set, the Python package; examples/c_api_example.c builds against that copy both with
# pkg-config and with find_package(pcs), and the two builds train a job together through the
# installed coordinator; `import pcs` from the prefix loads the installed library, and
# examples/torch_train.py (two ranks) trains its job through it.
# usage: test_install.sh BUILD_DIR SOURCE_DIR
set -u
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pcs-install.XXXXXX")
prefix=$tmp/prefix
coord=
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  [ -n "$coord" ] && { kill -KILL "$coord"; wait "$coord"; } 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done
  exit 1
}

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || fail "cmake --install"
so=$(find "$prefix" -name 'libpcs_worker.so' | head -n 1)
[ -n "$so" ] || fail "no libpcs_worker.so under $prefix"
libdir=$(dirname "$so")
for f in bin/pcs-coordinator bin/pcs-worker bin/pcsctl bin/pcs-reference bin/pcs-worker-node \
         include/pcs/worker.h include/pcs/status.h include/pcs/dtype.h include/pcs/half.h \
         share/pcs/pcs.protoset share/pcs/proto/pcs/v1/services.proto; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
[ -e "$libdir/pkgconfig/pcs-worker.pc" ] || fail "no pcs-worker.pc"
[ -e "$libdir/cmake/pcs/pcsConfig.cmake" ] || fail "no pcsConfig.cmake"
# only the API is exported: no gRPC, protobuf-c, collectives or runtime internals
# every defined dynamic symbol (code, data, weak, C++ vague linkage), not only functions
exports=$(nm -D --defined-only "$libdir/libpcs_worker.so" | awk 'NF == 3 {print $3}' | sed 's/@.*//' |
          grep -v '^PCS_WORKER_0')
echo "$exports" | grep -qx pcs_worker_join || fail "pcs_worker_join not exported"
bad=$(echo "$exports" | grep -v -e '^pcs_worker_' -e '^pcs_last_error$' -e '^pcs_clear_error$' \
      -e '^pcs_set_error' -e '^pcs_status_' -e '^pcs_log_breadcrumb$' -e '^pcs_dtype_')
[ -z "$bad" ] || fail "exported beyond the API: $(echo "$bad" | head -n 5 | tr '\n' ' ')"
ldd "$so" | grep -q microhttpd && fail "libpcs_worker.so pulls in libmicrohttpd (pcs-worker's endpoint)"

# a sanitized build (CI's ASan + UBSan pass) installs a sanitized library: its programs must load
# the sanitizer runtime first, as they do when built with the same flags
san=
ldd "$so" | grep -q libasan && san="-fsanitize=address,undefined"

# 1. pkg-config
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion pcs-worker)" = 0.1.0 ] || fail "pkg-config --modversion"
cc -O2 $san -o "$tmp/ex-pc" "$src/examples/c_api_example.c" \
  $(pkg-config --cflags --libs pcs-worker) -lm -Wl,-rpath,"$libdir" >"$tmp/cc.log" 2>&1 ||
  fail "build with pkg-config"
# 2. find_package(pcs)
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DEXAMPLE_SRC="$src/examples/c_api_example.c" -DCMAKE_BUILD_RPATH="$libdir" \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" \
  >"$tmp/consumer.log" 2>&1 || fail "configure with find_package(pcs)"
cmake --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1 || fail "build with find_package(pcs)"
for ex in "$tmp/ex-pc" "$tmp/consumer/c_api_example"; do
  ldd "$ex" | grep -q "$libdir/libpcs_worker.so" || fail "$ex does not use the installed library"
done

# 3. the two builds train one job through the installed coordinator and pcsctl
"$prefix/bin/pcs-coordinator" --listen 127.0.0.1:0 --port-file "$tmp/port" >"$tmp/coord.log" 2>&1 &
coord=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
[ -s "$tmp/port" ] || fail "the installed coordinator did not start"
addr=127.0.0.1:$(cat "$tmp/port")
"$tmp/ex-pc" --coordinator "$addr" --identity inst-a >"$tmp/ex0.log" 2>&1 &
pids+=($!)
"$tmp/consumer/c_api_example" --coordinator "$addr" --identity inst-b >"$tmp/ex1.log" 2>&1 &
pids+=($!)
cat >"$tmp/job.yaml" <<'JOB'
name: installed-c-api
model:
  explicit:
    modules:
      - {path: '', class: Regressor}
      - {path: fc, class: Linear, params: [{name: weight, shape: [4, 8]}, {name: bias, shape: [4]}]}
wrap: {explicit: [fc]}
strategy: full_shard
mesh: [{dim: dp_shard, size: 2}]
training: {steps: 20, micro_batch_size: 16, micro_batches: 2, optimizer: {adamw: {lr: 2.0e-2}}}
JOB
registered=
for _ in $(seq 200); do
  w=$("$prefix/bin/pcsctl" --coordinator "$addr" workers --state idle 2>/dev/null)
  echo "$w" | grep -q inst-a && echo "$w" | grep -q inst-b && { registered=1; break; }
  sleep 0.1
done
[ -n "$registered" ] || fail "the two example processes did not register"
job=$("$prefix/bin/pcsctl" --coordinator "$addr" submit "$tmp/job.yaml" | awk '{print $1; exit}')
[ -n "$job" ] || fail "submit"
timeout 120 "$prefix/bin/pcsctl" --coordinator "$addr" status --watch --interval-ms 200 "$job" \
  >"$tmp/watch.log" 2>&1 || fail "job $job did not succeed: $(tail -n 20 "$tmp/watch.log")"
for i in 0 1; do
  wait "${pids[$i]}" || fail "example $i exited non-zero"
done
pids=()

# 4. the Python package: importable from the prefix, it loads the installed library; with torch,
#    the example (examples/torch_train.py) writes its job and two ranks train it
pypkg=$(find "$prefix" -type d -path '*/dist-packages/pcs' | head -n 1)
[ -n "$pypkg" ] || fail "no Python package pcs under $prefix"
[ -e "$pypkg/_install.py" ] || fail "no pcs/_install.py"
py=
if [ -z "$san" ] && [ -x /usr/bin/python3 ]; then
  export PYTHONPATH=$(dirname "$pypkg")
  unset PCS_WORKER_LIBRARY
  (cd "$tmp" && /usr/bin/python3 -c 'import sys, pcs, pcs.worker as w
p = w.library_path(); assert p.startswith(sys.argv[1]), p; w._load(); print(pcs.__file__, p)' \
    "$prefix") >"$tmp/py.log" 2>&1 || fail "import pcs from the prefix: $(cat "$tmp/py.log")"
  grep -q "^$pypkg/__init__.py " "$tmp/py.log" ||
    fail "pcs imported from elsewhere: $(cat "$tmp/py.log")"
  py="; import pcs"
  if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    (cd "$tmp" && /usr/bin/python3 "$src/examples/torch_train.py" \
      --write-job "$tmp/torch-job.json") >"$tmp/torch-job.log" 2>&1 || fail "torch_train.py --write-job"
    for i in 0 1; do
      (cd "$tmp" && exec /usr/bin/python3 "$src/examples/torch_train.py" --coordinator "$addr" \
        --identity "torch-$i") >"$tmp/torch$i.log" 2>&1 &
      pids+=($!)
    done
    tjob=$("$prefix/bin/pcsctl" --coordinator "$addr" submit "$tmp/torch-job.json" |
           awk '{print $1; exit}')
    [ -n "$tjob" ] || fail "submit the torch job"
    timeout 180 "$prefix/bin/pcsctl" --coordinator "$addr" status --watch --interval-ms 200 \
      "$tjob" >"$tmp/twatch.log" 2>&1 ||
      fail "torch job $tjob did not succeed: $(tail -n 20 "$tmp/twatch.log")"
    for i in 0 1; do
      wait "${pids[$i]}" || fail "torch_train.py rank $i exited non-zero"
    done
    pids=()
    py="; import pcs, and examples/torch_train.py trained $tjob"
  elif [ "${PCS_REQUIRE_TOOLS:-0}" = 1 ]; then
    fail "python3-torch is not installed"
  fi
elif [ -z "$san" ] && [ "${PCS_REQUIRE_TOOLS:-0}" = 1 ]; then
  fail "no /usr/bin/python3"
fi
echo "ok: installed into $prefix; pkg-config and find_package(pcs) builds trained $job together$py"
