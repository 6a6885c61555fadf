#!/usr/bin/env bash
# Runs the fault suite and prints its figures as the tables of
# docs/reliability.md: p99 per front end during each fault, recovery,
# failover and over-admission per cell.
set -euo pipefail
cd "$(dirname "$0")/.."
# FAULT_LOG=FILE keeps the suite's verbose output there.
out=${FAULT_LOG:-$(mktemp)}
go test -count=1 -v -timeout=15m -run 'Test(Standalone|Sentinel|Cluster|Topology)' ./fault > "$out" 2>&1 || { tail -50 "$out"; exit 1; }
awk -F'\t' '
function cellname(t,   c, n) {
  n = split(t, c, "/")
  sub(/^Test/, "", c[1])
  if (c[1] == "StandaloneFaults") return c[2] " / " c[3]
  if (c[1] == "SentinelFailover") c[1] = "Sentinel failover"
  if (c[1] == "ClusterFailover") c[1] = "Cluster failover"
  if (c[1] == "ClusterSlotMigration") c[1] = "Cluster slot migration"
  if (c[1] == "TopologyUnreachableAtStart") return (c[2] == "sentinel" ? "Sentinel" : "Cluster") " unreachable at start / " c[3]
  return c[1] " / " c[2]
}
/report\t/ {
  cell = cellname($2); gsub(/_/, " ", cell); what = $3
  if (!(cell in seen)) { seen[cell] = 1; cells[++n] = cell }
  if (!(what in wseen)) { wseen[what] = 1; whats[++m] = what }
  val[cell, what] = $4
}
function table(title, pick,   i, j, k) {
  print title; print ""
  printf "| fault / on_error |"; for (j = 1; j <= m; j++) if ((whats[j] ~ /^(POST|GET|admit|gRPC|WebSocket)/) == pick) printf " %s |", whats[j]; print ""
  printf "|---|"; for (j = 1; j <= m; j++) if ((whats[j] ~ /^(POST|GET|admit|gRPC|WebSocket)/) == pick) printf "---|"; print ""
  for (i = 1; i <= n; i++) {
    printf "| %s |", cells[i]
    for (j = 1; j <= m; j++) if ((whats[j] ~ /^(POST|GET|admit|gRPC|WebSocket)/) == pick) { k = cells[i] SUBSEP whats[j]; printf " %s |", (k in val) ? val[k] : "–" }
    print ""
  }
  print ""
}
END {
  table("p99 of each front end while the fault lasts (20 answers each):", 1)
  table("Recovery (from the store'"'"'s return, or the promotion), failover (Redis'"'"'s own), the spent user'"'"'s admissions after the fault, answers while a slot moved:", 0)
}' "$out"
[ -n "${FAULT_LOG:-}" ] || rm -f "$out"
