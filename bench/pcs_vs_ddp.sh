#!/usr/bin/env bash
# pcs against PyTorch DDP on this machine (issue 18): the demo MLP (256-1024x4-16, 4 micro-batches
# of 32 rows per rank, AdamW, clip 1.0) at W ranks, fp32 (torch 1.13's CPU bf16 autocast fails on
# this model, so there is no bf16 DDP to compare with), interleaved rounds of
#   ddp            bench/ddp_step.py (torch.distributed gloo, no_sync on 3 of 4 micro-batches)
#   full_shard     pcs-step-bench -s full_shard (accumulation: reshard, FSDP's default)
#   full_shard+kg  the same with training.accumulation keep_gathered
#   shard_grad_op  pcs-step-bench -s shard_grad_op
#   no_shard       pcs-step-bench -s no_shard
#   torch.fs       bench/torch_step.py: the same MLP as a PyTorch module through pcs.torch
#                  (PyTorch computes, pcs shards and reduces), full_shard, prefetch on
#   torch.fs-nopf  the same without pcs.torch's prefetch
#   torch.ns       pcs.torch, no_shard
# and prints, per config, the median step time over the rounds and its ratio to DDP's median in
# the same run, with the load average before and after (the machine is shared: read ratios).
# usage: bench/pcs_vs_ddp.sh BUILD_DIR [rounds] [W]
set -u
build=$(cd "${1:?usage: pcs_vs_ddp.sh BUILD_DIR [rounds] [W]}" && pwd)
rounds=${2:-3}
world=${3:-4}
prec=fp32
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
if ! $py -c 'import torch' 2>/dev/null; then
  echo "pcs_vs_ddp: python3-torch is not installed (deploy/install-deps.sh)" >&2
  exit 77
fi
bench="$build/bin/pcs-step-bench"
configs=(ddp full_shard full_shard+kg shard_grad_op no_shard torch.fs torch.fs-nopf torch.ns)
declare -A times
run() { # config -> step ms
  case "$1" in
    ddp) $py "$here/ddp_step.py" -g "$world" |
           sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p' ;;
    torch.fs) $py "$here/torch_step.py" "$build" -g "$world" -s full_shard |
                sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p' ;;
    torch.fs-nopf) $py "$here/torch_step.py" "$build" -g "$world" -s full_shard --no-prefetch |
                     sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p' ;;
    torch.ns) $py "$here/torch_step.py" "$build" -g "$world" -s no_shard |
                sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p' ;;
    full_shard+kg) "$bench" -g "$world" -p "$prec" -s full_shard -a keep_gathered \
                     --check-steps 0 | awk -v w="$world" '$1 == w && $2 == "on" {print $3}' ;;
    *) "$bench" -g "$world" -p "$prec" -s "$1" --check-steps 0 |
         awk -v w="$world" '$1 == w && $2 == "on" {print $3}' ;;
  esac
}
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$rounds"); do
  for c in "${configs[@]}"; do
    t=$(run "$c")
    times[$c]="${times[$c]:-} ${t:-nan}"
  done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
ddp=$(echo "${times[ddp]}" | median)
echo "# pcs vs PyTorch $($py -c 'import torch; print(torch.__version__)') DDP (gloo), mlp 256-1024x4-16, $prec, W=$world, 4 micro-batches x 32 rows, AdamW, clip 1.0"
echo "# host $(hostname)  nproc $(nproc)  git $(git -C "$here" rev-parse --short HEAD 2>/dev/null)  rounds $rounds (interleaved)  load avg before: $load0  after: $load1"
printf "# %-14s %10s  %8s  %s\n" config "step (ms)" "x DDP" "rounds (ms)"
for c in "${configs[@]}"; do
  m=$(echo "${times[$c]}" | median)
  ratio=$(awk -v a="$m" -v b="$ddp" 'BEGIN {printf (b > 0 ? "%.2f" : "-"), a / b}')
  printf "  %-14s %10s  %8s  %s\n" "$c" "$m" "$ratio" "${times[$c]}"
done
