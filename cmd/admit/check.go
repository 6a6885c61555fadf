package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/admitdev/admit/internal/server"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy/catalog"
)

const checkUsage = `Usage: admit check --tenant T [--user U] [--action A] [--cost N] [--server URL]

Decides one request and prints the decision. With --server it asks that
server's POST /v1/check; without, it evaluates the configuration (--config,
or the built-in demo) locally with the server's own handler on a fresh
memory store, which shows which rules a request is charged against and what
they allow; a tenant with API keys needs --api-key there too.

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
	token := fs.String("token", "", "a service (or the admin) `token`, to ask as the platform's backend: for any tenant, with the --ip of rules all tenants share (default $ADMIT_SERVICE_TOKEN)")
	config := fs.String("config", "", "evaluate this configuration `file` locally (default: the built-in demo)")
	asJSON := fs.Bool("json", false, "print the decision as JSON")
	if code, done := parseFlags(fs, checkUsage, args, e); done {
		return code
	}
	body, _ := json.Marshal(req)
	var status int
	var raw []byte
	var err error
	if *serverURL != "" {
		status, raw, err = askServer(ctx, *serverURL, first(*token, e.getenv("ADMIT_SERVICE_TOKEN")), body)
	} else {
		status, raw, err = askLocally(ctx, *config, body)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "admit check: %v\n", err)
		return 2
	}
	if status != http.StatusOK && status != http.StatusTooManyRequests {
		var p struct {
			Detail string `json:"detail"`
		}
		_ = json.Unmarshal(raw, &p)
		fmt.Fprintf(e.stderr, "admit check: %d %s: %s\n", status, http.StatusText(status), first(p.Detail, strings.TrimSpace(string(raw))))
		return 2
	}
	var ans checkAnswer
	if err := json.Unmarshal(raw, &ans); err != nil {
		fmt.Fprintf(e.stderr, "admit check: the answer is not a decision: %v\n", err)
		return 2
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

// askServer posts a check body to a server's /v1/check, with token (if
// any) as a bearer token.
func askServer(ctx context.Context, url, token string, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(url, "/")+"/v1/check", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, raw, err
}

// askLocally answers a check body with the server's own handler, in
// process, on the configuration file (or the demo) and a fresh memory
// store: the same resolution, decision and answer a server would give to
// the platform's own backend (a service token), since whoever runs it has
// the file.
func askLocally(ctx context.Context, file string, body []byte) (int, []byte, error) {
	cfg, _, err := loadServeConfig(file)
	if err != nil {
		return 0, nil, err
	}
	catalog, err := catalog.New(ctx, cfg.Spec(), nil)
	if err != nil {
		return 0, nil, err
	}
	store := memstore.New(nil)
	defer store.Close()
	const local = "admit-check-local"
	srv, err := server.New(server.Options{Store: store, Catalog: catalog, ServiceTokens: []string{local}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return 0, nil, err
	}
	defer srv.Close()
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/check", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+local)
	srv.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes(), nil
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
