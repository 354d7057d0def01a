#!/usr/bin/env bash
# pcs's Gloo-backend collectives against PyTorch 1.13's gloo (issue 18's "all-reduce >= 1.0x torch
# gloo at every size from 64 KB to 64 MB; reduce-scatter >= 1.0x the best torch fallback"), fp32
# sum, W ranks on this host, interleaved rounds of
#   pcs-coll-bench -C rs,ar      pcs (shared memory between ranks of one host), with its TCP twin
#                                and raw gloo::allreduce in the same run
#   bench/torch_coll.py          torch.distributed all_reduce; reduce-scatter fallbacks: all_reduce
#                                + slice, all_to_all_single + local sum (torch's gloo has no
#                                reduce_scatter)
# and prints per size the median time of each and the ratios (< 1: pcs is faster).
# usage: bench/coll_vs_torch.sh BUILD_DIR [rounds] [W]
set -u
build=$(cd "${1:?usage: coll_vs_torch.sh BUILD_DIR [rounds] [W]}" && pwd)
rounds=${2:-3}
world=${3:-2}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
if ! $py -c 'import torch' 2>/dev/null; then
  echo "coll_vs_torch: python3-torch is not installed (deploy/install-deps.sh)" >&2
  exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pcs-coll-vs-torch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
args=(-b 65536 -e 67108864 -f 4 -n 20 -w 5)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$rounds"); do
  "$build/bin/pcs-coll-bench" -g "$world" "${args[@]}" -C rs,ar -F "$tmp/pcs.$r.csv" >/dev/null ||
    { echo "coll_vs_torch: pcs-coll-bench failed" >&2; exit 1; }
  $py "$here/torch_coll.py" -g "$world" "${args[@]}" > "$tmp/torch.$r.txt" ||
    { echo "coll_vs_torch: torch_coll.py failed" >&2; exit 1; }
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
# one "key size value" line per measurement, then medians per (key, size)
{
  for f in "$tmp"/pcs.*.csv; do
    awk -F, 'NR > 1 {print "pcs_" $4, $1, $6; if ($11 >= 0) print "pcs_tcp_" $4, $1, $11;
                     if ($10 >= 0) print "raw_" $4, $1, $10}' "$f"
  done
  cat "$tmp"/torch.*.txt
} | sort -k1,1 -k2,2n -k3,3g | awk '
  { k = $1 " " $2; v[k, ++n[k]] = $3; keys[k] = 1 }
  END { for (k in keys) print k, v[k, int((n[k] + 1) / 2)] }' | sort -k2,2n > "$tmp/med.txt"
get() { awk -v k="$1" -v s="$2" '$1 == k && $2 == s {print $3}' "$tmp/med.txt"; }
echo "# pcs vs PyTorch $($py -c 'import torch; print(torch.__version__)') gloo collectives, fp32 sum, W=$world ranks on this host"
echo "# host $(hostname)  nproc $(nproc)  git $(git -C "$here" rev-parse --short HEAD 2>/dev/null)  rounds $rounds (interleaved, medians)  load avg before: $load0  after: $load1"
echo "# times in us; ratio = pcs / peer (< 1: pcs faster); pcs = shared memory, pcs tcp = the same call over TCP"
printf "#%10s %9s %9s %9s %9s %7s %7s | %9s %9s %9s %9s %7s\n" bytes "AR pcs" "pcs tcp" "raw gloo" \
  "torch" "/raw" "/torch" "RS pcs" "pcs tcp" "torch ar" "torch a2a" "/best"
for s in $(awk '{print $2}' "$tmp/med.txt" | sort -un); do
  ar=$(get pcs_AR "$s"); art=$(get pcs_tcp_AR "$s"); raw=$(get raw_AR "$s"); tar=$(get all_reduce "$s")
  rs=$(get pcs_RS "$s"); rst=$(get pcs_tcp_RS "$s"); t1=$(get rs_allreduce "$s"); t2=$(get rs_alltoall "$s")
  awk -v s="$s" -v ar="${ar:-nan}" -v art="${art:-nan}" -v raw="${raw:-nan}" -v tar="${tar:-nan}" \
      -v rs="${rs:-nan}" -v rst="${rst:-nan}" -v t1="${t1:-nan}" -v t2="${t2:-nan}" 'BEGIN {
    best = t1 + 0; if (t2 != "nan" && (best == 0 || t2 + 0 < best)) best = t2 + 0
    printf " %10d %9s %9s %9s %9s %7.2f %7.2f | %9s %9s %9s %9s %7.2f\n", s, ar, art, raw, tar,
      (raw > 0 ? ar / raw : 0), (tar > 0 ? ar / tar : 0), rs, rst, t1, t2, (best > 0 ? rs / best : 0)
  }'
done
