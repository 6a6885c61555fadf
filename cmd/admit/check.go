package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

const checkUsage = `Usage: admit check --tenant T [--user U] [--action A] [--cost N] [--server URL]

Decides one request and prints the decision. With --server it asks that
server's POST /v1/check; without, it evaluates the configuration (--config,
or the built-in demo) locally on a fresh memory store, which shows which
rules a request is charged against and what they allow.

Exit codes: 0 admitted, 1 refused, 2 error.

Flags:
`

// checkAnswer is the JSON answer of /v1/check, as far as check prints it.
type checkAnswer struct {
	Allowed      bool         `json:"allowed"`
	Limit        int64        `json:"limit"`
	Remaining    int64        `json:"remaining"`
	ResetAfterMS int64        `json:"reset_after_ms"`
	RetryAfterMS int64        `json:"retry_after_ms"`
	DeniedBy     string       `json:"denied_by"`
	Tenant       string       `json:"tenant"`
	Tier         string       `json:"tier"`
	Rules        []ruleAnswer `json:"rules"`
}

// ruleAnswer is one entry of a decision's rules.
type ruleAnswer struct {
	Name         string `json:"name"`
	Scope        string `json:"scope"`
	Algorithm    string `json:"algorithm"`
	Allowed      bool   `json:"allowed"`
	Shadow       bool   `json:"shadow"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMS int64  `json:"reset_after_ms"`
	RetryAfterMS int64  `json:"retry_after_ms"`
}

func check(ctx context.Context, args []string, e *env) int {
	fs := flag.NewFlagSet("admit check", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var req struct {
		Tenant string `json:"tenant,omitempty"`
		User   string `json:"user,omitempty"`
		Action string `json:"action,omitempty"`
		Cost   int64  `json:"cost"`
		IP     string `json:"ip,omitempty"`
		APIKey string `json:"api_key,omitempty"`
		DryRun bool   `json:"dry_run,omitempty"`
	}
	fs.StringVar(&req.Tenant, "tenant", "", "tenant `id`")
	fs.StringVar(&req.User, "user", "", "user `id` within the tenant")
	fs.StringVar(&req.Action, "action", "", "the `action` being limited")
	fs.Int64Var(&req.Cost, "cost", 1, "the request's `cost` (0 peeks)")
	fs.StringVar(&req.IP, "ip", "", "the client's IP `address`")
	fs.StringVar(&req.APIKey, "api-key", "", "the client's API `key`")
	fs.BoolVar(&req.DryRun, "dry-run", false, "decide without charging")
	serverURL := fs.String("server", "", "ask the server at `URL` (like http://127.0.0.1:8080)")
	config := fs.String("config", "", "evaluate this configuration `file` locally (default: the built-in demo)")
	asJSON := fs.Bool("json", false, "print the decision as JSON")
	fs.Usage = func() { fmt.Fprint(fs.Output(), checkUsage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(e.stdout)
			fs.Usage()
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "admit check: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var ans checkAnswer
	var raw []byte
	if *serverURL != "" {
		body, _ := json.Marshal(req)
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(*serverURL, "/")+"/v1/check", bytes.NewReader(body))
		if err != nil {
			fmt.Fprintf(e.stderr, "admit check: %v\n", err)
			return 2
		}
		hreq.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(hreq)
		if err != nil {
			fmt.Fprintf(e.stderr, "admit check: %v\n", err)
			return 2
		}
		defer resp.Body.Close()
		raw, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
			var p struct {
				Detail string `json:"detail"`
			}
			_ = json.Unmarshal(raw, &p)
			fmt.Fprintf(e.stderr, "admit check: %s: %s\n", resp.Status, first(p.Detail, strings.TrimSpace(string(raw))))
			return 2
		}
		if err := json.Unmarshal(raw, &ans); err != nil {
			fmt.Fprintf(e.stderr, "admit check: the server's answer is not a decision: %v\n", err)
			return 2
		}
	} else {
		cfg, _, err := loadServeConfig(*config)
		if err != nil {
			fmt.Fprintln(e.stderr, err)
			return 2
		}
		p, err := policy.Compile(cfg.Spec())
		if err != nil {
			fmt.Fprintln(e.stderr, err)
			return 2
		}
		store := memstore.New(nil)
		defer store.Close()
		preq := policy.Request{Tenant: req.Tenant, User: req.User, Action: req.Action, IP: req.IP, APIKey: req.APIKey, Cost: req.Cost, DryRun: req.DryRun}
		var res policy.Resolution
		if err := p.Resolve(&preq, &res); err != nil {
			fmt.Fprintf(e.stderr, "admit check: %v\n", err)
			return 2
		}
		var d admit.Decision
		if len(res.Charges) > 0 {
			if err := store.Decide(ctx, res.Charges, &d); err != nil {
				fmt.Fprintf(e.stderr, "admit check: %v\n", err)
				return 2
			}
		} else {
			d.Allowed = true
		}
		ans = localAnswer(&res, &d)
		raw, _ = json.Marshal(ans)
	}
	if *asJSON {
		fmt.Fprintln(e.stdout, strings.TrimSpace(string(raw)))
	} else {
		printDecision(e.stdout, &ans)
	}
	if !ans.Allowed {
		return 1
	}
	return 0
}

func localAnswer(res *policy.Resolution, d *admit.Decision) checkAnswer {
	msOf := func(t time.Duration) int64 { return int64((t + time.Millisecond - 1) / time.Millisecond) }
	ans := checkAnswer{
		Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining, ResetAfterMS: msOf(d.ResetAfter),
		RetryAfterMS: msOf(d.RetryAfter), DeniedBy: d.DeniedBy,
	}
	if res.Tenant != nil {
		ans.Tenant, ans.Tier = res.Tenant.ID, res.Tenant.Tier.Name
	}
	ans.Rules = make([]ruleAnswer, len(res.Rules))
	for i, r := range res.Rules {
		x := &d.Results[i]
		a := &ans.Rules[i]
		a.Name, a.Scope, a.Algorithm, a.Allowed, a.Shadow = r.Name, r.Scope, r.Algorithm.String(), x.Allowed, x.Shadow
		a.Limit, a.Remaining, a.ResetAfterMS, a.RetryAfterMS = x.Limit, x.Remaining, msOf(x.ResetAfter), msOf(x.RetryAfter)
	}
	return ans
}

func printDecision(w io.Writer, a *checkAnswer) {
	verdict := "ADMITTED"
	if !a.Allowed {
		verdict = fmt.Sprintf("REFUSED by %s (retry after %dms)", a.DeniedBy, a.RetryAfterMS)
	}
	fmt.Fprintf(w, "%s", verdict)
	if a.Tenant != "" {
		fmt.Fprintf(w, "  tenant %s, tier %s", a.Tenant, a.Tier)
	}
	fmt.Fprintln(w)
	if len(a.Rules) == 0 {
		fmt.Fprintln(w, "no rule applies to this request")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tSCOPE\tALGORITHM\tRESULT\tLIMIT\tREMAINING\tRESET\tRETRY")
	for _, r := range a.Rules {
		res := "admits"
		switch {
		case !r.Allowed && r.Shadow:
			res = "refuses (shadow)"
		case !r.Allowed:
			res = "refuses"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%dms\t%dms\n", r.Name, r.Scope, r.Algorithm, res, r.Limit, r.Remaining, r.ResetAfterMS, r.RetryAfterMS)
	}
	tw.Flush()
}
