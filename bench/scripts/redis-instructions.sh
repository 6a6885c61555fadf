#!/usr/bin/env bash
# redis-instructions.sh counts the instructions redis-server executes per
# decision of Admit's Redis function, under callgrind: a count that does not
# move with the machine's load, unlike the time-based benchmarks (make
# bench-redis), so two versions of redisstore/admit.lua can be compared in
# any hour. It starts its own redis-server on 127.0.0.1 (port 16600 unless
# PORT is set) under valgrind, loads the library, warms it up, then sends N
# batches of 11 token-bucket decisions each with redis-benchmark (one
# caller, keys spread by -r 10000: mostly new user keys, one global key),
# and prints the instructions per call and per decision. ALG=fixed or
# ALG=sliding makes the rules fixed or sliding windows (a billion a minute,
# never refusing) instead of token buckets.
#
#   bench/scripts/redis-instructions.sh [LIBRARY.lua] [SCOPES 1|3] [N]
#
# Needs valgrind, redis-server, redis-cli and redis-benchmark (Debian:
# valgrind redis-server redis-tools). RS names another redis-server binary.
set -euo pipefail
LIB=${1:-"$(dirname "$0")/../../redisstore/admit.lua"}
SC=${2:-1}
N=${3:-1000}
PORT=${PORT:-16600}
OUT=$(mktemp)
valgrind --tool=callgrind --callgrind-out-file="$OUT" "${RS:-redis-server}" \
  --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
VP=$!
trap 'kill "$VP" 2>/dev/null || true; [ -n "${KEEP:-}" ] && cp "$OUT" "$KEEP"; rm -f "$OUT"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
redis-cli -p "$PORT" -x FUNCTION LOAD REPLACE <"$LIB" >/dev/null
# Rules as batches send them (see batchArgs in redisstore/batch.go): token
# buckets of 1M/s, 10M/s and 100M/s, bursts the same.
R1='1,0,0,30000000,0,1000000,1000,0,1000000,1000000,0,0,0,0,0'
R2='1,0,0,30000000,0,10000000,100,0,10000000,10000000,0,0,0,0,0'
R3='1,0,0,30000000,0,100000000,10,0,100000000,100000000,0,0,0,0,0'
case "${ALG:-bucket}" in
bucket) ;;
fixed | sliding)
  A=3
  [ "$ALG" = sliding ] && A=4
  R1="$A,0,0,30000000,0,1000000000,60000000,0,0,0,0,0,0,0,0"
  R2="$A,0,0,30000000,0,2000000000,60000000,0,0,0,0,0,0,0,0"
  R3="$A,0,0,30000000,0,3000000000,60000000,0,0,0,0,0,0,0,0"
  ;;
*) echo "ALG=$ALG: want bucket, fixed or sliding" >&2; exit 2 ;;
esac
KEYS=() ARGS=()
for _ in $(seq 11); do
  KEYS+=("admit:{t__rand_int__}4:user9:tenant-x:user-__rand_int__:4:user")
  if [ "$SC" = 3 ]; then
    KEYS+=("admit:{t__rand_int__}6:tenant9:tenant-__rand_int__:0:6:tenant" "admit:{g}6:global0:0:0:6:global")
    ARGS+=(3 1 1 2 1 3 1)
  else
    ARGS+=(1 1 1)
  fi
done
if [ "$SC" = 3 ]; then RULES=(3 11 156 "$R1" "$R2" "$R3"); else RULES=(1 11 68 "$R1"); fi
CMD=(FCALL admit_v5 "${#KEYS[@]}" "${KEYS[@]}" b "" "" "${RULES[@]}" "${ARGS[@]}")
redis-benchmark -p "$PORT" -n 200 -c 1 -r 10000 "${CMD[@]}" >/dev/null
callgrind_control -z "$VP" >/dev/null 2>&1
redis-benchmark -p "$PORT" -n "$N" -c 1 -r 10000 "${CMD[@]}" >/dev/null
redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
wait "$VP" || true
IR=$(grep -E '^(summary|totals):' "$OUT" | head -1 | awk '{print $2}')
echo "$(basename "$LIB") alg=${ALG:-bucket} scopes=$SC instructions/call=$((IR / N)) instructions/decision=$((IR / N / 11))"
