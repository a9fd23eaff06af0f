#!/usr/bin/env bash
# Trains the demo MLP with gradient accumulation (6 micro-batches per step)
# on 1, 2 and 3 MPI ranks, and sharded on 2, and checks the final train
# losses: W ranks against 1 rank within a relative tolerance of 1e-4 (the
# runs see the same micro-batch gradients bit for bit and differ only in the
# f32 summation order of the accumulators; docs/RUNTIME.md "Gradient
# accumulation with data parallelism"), sharded == replicated exactly.
#   run-accumulate-ranks.sh MPIEXEC TRAINER BUNDLE [mpirun flags...]
set -euo pipefail
mpiexec=$1 trainer=$2 bundle=$3
shift 3
tol=1e-4
declare -A loss
run() { # name np [flags]
  local name=$1 np=$2
  shift 2
  local out
  out=$("$mpiexec" -np "$np" --oversubscribe "$@" "$trainer" --bundle "$bundle" \
        --steps 200 --micro-batches 6 --batch 96 ${extra:-})
  echo "$out" | sed "s/^/[$name] /"
  loss[$name]=$(echo "$out" | sed -n 's/^final train loss: //p')
  [ -n "${loss[$name]}" ] || { echo "no final loss from $name"; exit 1; }
}
extra="" run np1 1 "$@"
extra="" run np2 2 "$@"
extra="" run np3 3 "$@"
extra="--sharded" run np2-sharded 2 "$@"
ok=1
for name in np2 np3; do
  if awk -v a="${loss[np1]}" -v b="${loss[$name]}" -v t=$tol \
       'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t * a) }'; then
    echo "$name: ${loss[$name]} vs 1 rank ${loss[np1]}: within $tol relative"
  else
    echo "$name: ${loss[$name]} vs 1 rank ${loss[np1]}: NOT within $tol relative"
    ok=0
  fi
done
if [ "${loss[np2-sharded]}" = "${loss[np2]}" ]; then
  echo "sharded at 2 ranks == replicated at 2 ranks: ${loss[np2]}"
else
  echo "sharded at 2 ranks ${loss[np2-sharded]} != replicated ${loss[np2]}"
  ok=0
fi
[ $ok = 1 ] && echo "final losses agree"
