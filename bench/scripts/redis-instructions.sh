#!/usr/bin/env bash
# redis-instructions.sh counts the instructions redis-server executes per
# decision of Admit's Redis function, under callgrind: a count that does not
# move with the machine's load, unlike the time-based benchmarks (make
# bench-redis), so two versions of redisstore/admit.lua can be compared in
# any hour. It starts its own redis-server on 127.0.0.1 (port 16600 unless
# PORT is set) under valgrind, loads the library, warms it up, then sends N
# batches of 11 one-charge decisions each with redis-benchmark (one caller),
# and prints the instructions per call and per decision.
#
# ALG picks the rule: bucket (token bucket, default), gcra, fixed, sliding,
# quota, log (sliding log) or concurrency; or peer, which counts instead
# envoyproxy/ratelimit's two commands per descriptor (INCRBY, EXPIRE). Limits are large enough that
# nothing is refused. Each charge's key is one of KEYSPACE (default 1000)
# keys, drawn at random, so that after the warm-up (W batches, default
# 2000) most keys exist, as they do for a live tenant's users; SCOPES=3
# adds a tenant key (also one of KEYSPACE) and a global key to every
# decision.
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
KEYSPACE=${KEYSPACE:-1000}
W=${W:-2000}
OP=${OP:-b}
FN=$(head -1 "$LIB" | sed -n 's/^#!lua name=//p')
OUT=$(mktemp)
valgrind --tool=callgrind --callgrind-out-file="$OUT" "${RS:-redis-server}" \
  --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
VP=$!
trap 'kill "$VP" 2>/dev/null || true; [ -n "${KEEP:-}" ] && cp "$OUT" "$KEEP"; rm -f "$OUT"*' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
if [ "${ALG:-}" = peer ]; then
  # envoyproxy/ratelimit's commands for one descriptor of a fixed window,
  # INCRBY then EXPIRE, each pipelined 44 deep (4 commands × 11
  # decisions) on one of KEYSPACE keys named as it names them.
  K="bench_tenant_tenant-1_user_user-__rand_int___1795618800"
  redis-benchmark -p "$PORT" -n "$W" -c 1 -P 44 -r "$KEYSPACE" INCRBY "$K" 1 >/dev/null
  for cmd in "INCRBY $K 1" "EXPIRE $K 3600"; do
    callgrind_control -z "$VP" >/dev/null 2>&1
    # shellcheck disable=SC2086 # the command's words
    redis-benchmark -p "$PORT" -n "$((N * 44))" -c 1 -P 44 -r "$KEYSPACE" $cmd >/dev/null
    callgrind_control -d "$VP" >/dev/null 2>&1
    sleep 1
    F=$(ls -t "$OUT".* | head -1)
    IR=$(grep -E '^(summary|totals):' "$F" | head -1 | awk '{print $2}')
    echo "peer ${cmd%% *}: instructions/command=$((IR / N / 44))"
  done
  exit 0
fi
redis-cli -p "$PORT" -x FUNCTION LOAD REPLACE <"$LIB" >/dev/null
# Rules as batches send them (see ruleArgs in redisstore/args.go): the
# algorithm, then cost, shadow, lease TTL (µs), how, then the parameters.
# User, tenant and global limits differ only in size.
rule() { # rule SIZE
  case "${ALG:-bucket}" in
  bucket) echo "1,0,0,30000000,0,$1,1000000000,0,$1,$1,0,0,0,0,0" ;;       # SIZE/s, burst SIZE
  gcra) echo "2,0,0,30000000,0,$1,1000000000,0,$1,$1,0,0,0,0,0" ;;
  fixed) echo "3,0,0,30000000,0,$1,60000000,0,0,0,0,0,0,0,0" ;;            # SIZE a minute
  sliding) echo "4,0,0,30000000,0,$1,60000000,0,0,0,0,0,0,0,0" ;;
  log) echo "5,0,0,30000000,0,$1,1000000,0,0,0,0,0,0,0,0" ;;               # SIZE a second
  quota) echo "8,0,0,30000000,0,$1,0,0,0,0,0,0,0,0,0" ;;                   # SIZE a day
  concurrency) echo "7,0,0,1000000,0,$1,1000000,0,0,0,0,0,0,0,0" ;;        # SIZE at once, 1 s leases
  *) echo "ALG=$ALG: want bucket, gcra, fixed, sliding, log, quota or concurrency" >&2; exit 2 ;;
  esac
}
R1=$(rule 1000000000) R2=$(rule 2000000000) R3=$(rule 3000000000)
# A quota's charge brings the ends of its period and the next (µs): a day
# far ahead, so that the period does not end during the run.
END1=4102444800000000 END2=4102531200000000
charge() { # charge RULE-NUMBER
  case "${ALG:-bucket}" in
  quota) echo "$1 1 $END1 $END2" ;;
  concurrency) echo "$1 1 ''" ;;
  *) echo "$1 1" ;;
  esac
}
KEYS=() ARGS=()
for d in $(seq 11); do
  head=1
  [ "$SC" = 3 ] && head=3
  [ "${ALG:-bucket}" = concurrency ] && head="$head:r:l${d}__rand_int__"
  ARGS+=("$head")
  KEYS+=("admit:{u__rand_int__}:user")
  read -ra c <<<"$(charge 1)"
  ARGS+=("${c[@]}")
  if [ "$SC" = 3 ]; then
    KEYS+=("admit:{t__rand_int__}:tenant" "admit:{g}:global")
    read -ra c <<<"$(charge 2)"
    ARGS+=("${c[@]}")
    read -ra c <<<"$(charge 3)"
    ARGS+=("${c[@]}")
  fi
  [ "${ALG:-bucket}" = concurrency ] && KEYS+=("admit:{l__rand_int__}:lease")
done
ARGS=("${ARGS[@]//\'\'/}")
if [ "$SC" = 3 ]; then RULES=(3 11 156 "$R1" "$R2" "$R3"); else RULES=(1 11 68 "$R1"); fi
CMD=(FCALL "$FN" "${#KEYS[@]}" "${KEYS[@]}" "$OP" "" "" "${RULES[@]}" "${ARGS[@]}")
redis-benchmark -p "$PORT" -n "$W" -c 1 -r "$KEYSPACE" "${CMD[@]}" >/dev/null
callgrind_control -z "$VP" >/dev/null 2>&1
redis-benchmark -p "$PORT" -n "$N" -c 1 -r "$KEYSPACE" "${CMD[@]}" >/dev/null
redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
wait "$VP" || true
IR=$(grep -E '^(summary|totals):' "$OUT" | head -1 | awk '{print $2}')
echo "$(basename "$LIB") alg=${ALG:-bucket} scopes=$SC instructions/call=$((IR / N)) instructions/decision=$((IR / N / 11))"
