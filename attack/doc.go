// Package attack is Admit's attack suite: each test starts admit serve or
// admit proxy (and Redis, where it applies) as real processes on loopback,
// attacks them as an unauthenticated client or a hostile tenant would, and
// fails if the attack works. Each logs the figure it measures ("report"
// lines: Redis commands per request, series created, memory used), which
// docs/security.md lists with the command that reruns them:
//
//	go test -count=1 -v ./attack/
package attack
