#!/usr/bin/env bash
# Runs the fault suite and prints its figures as the tables of
# docs/reliability.md: p99 per front end during each fault, recovery,
# failover and over-admission per cell.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
go test -count=1 -v -timeout=15m -run 'Test(Standalone|Sentinel|Cluster)' ./fault > "$out" 2>&1 || { tail -50 "$out"; exit 1; }
awk -F'\t' '/report\t/ {
  split($2, c, "/"); cell = c[2] " / " c[3]; what = $3; v = $4
  if (!(cell in seen)) { seen[cell] = 1; cells[++n] = cell }
  if (!(what in wseen)) { wseen[what] = 1; whats[++m] = what }
  val[cell, what] = v
}
END {
  printf "| fault / on_error |"; for (j = 1; j <= m; j++) printf " %s |", whats[j]; print ""
  printf "|---|"; for (j = 1; j <= m; j++) printf "---|"; print ""
  for (i = 1; i <= n; i++) {
    printf "| %s |", cells[i]
    for (j = 1; j <= m; j++) { k = cells[i] SUBSEP whats[j]; printf " %s |", (k in val) ? val[k] : "" }
    print ""
  }
}' "$out"
rm -f "$out"
