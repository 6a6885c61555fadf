package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/problem"
)

// maxLLMRows bounds the tenant × model pairs the LLM meter keeps apart,
// "(other)" included (and so the label sets of its metrics): past it,
// calls are counted under tenant and model "(other)". Tenants choose
// model names.
const maxLLMRows = 1000

type llmKey struct{ tenant, model string }

type llmRow struct {
	requests, unreported int64
	tokens               policy.Tokens
	cost                 int64 // millionths of the currency
}

// llmMeter sums settled LLM calls per tenant and model: the usage API,
// Prometheus metrics, and, when records is set, one JSON line per call
// (a billing record).
type llmMeter struct {
	currency string
	mu       sync.Mutex
	rows     map[llmKey]*llmRow
	records  io.Writer
	// store keeps the usage by day for every proxy of the deployment;
	// pending holds the calls not yet added to it (flush).
	store   llm.UsageStore
	pending []*llm.Record
	flushMu sync.Mutex
	log     *slog.Logger

	requests, tokens, cost, unreported, searches *prometheus.Desc
}

func newLLMMeter(currency string, records io.Writer, store llm.UsageStore, log *slog.Logger) *llmMeter {
	return &llmMeter{
		currency: currency, rows: map[llmKey]*llmRow{}, records: records, store: store, log: log,
		requests:   prometheus.NewDesc("admit_llm_requests_total", "LLM calls settled, per tenant and model.", []string{"tenant", "model"}, nil),
		tokens:     prometheus.NewDesc("admit_llm_tokens_total", "LLM tokens used, per tenant, model and kind ("+strings.Join(policy.TokenKindNames[:policy.WebSearch], ", ")+").", []string{"tenant", "model", "kind"}, nil),
		searches:   prometheus.NewDesc("admit_llm_web_searches_total", "Web searches LLM calls ran at the provider, per tenant and model.", []string{"tenant", "model"}, nil),
		cost:       prometheus.NewDesc("admit_llm_cost_total", "What LLM calls cost at the configured prices, in the currency.", []string{"tenant", "model", "currency"}, nil),
		unreported: prometheus.NewDesc("admit_llm_unreported_total", "LLM calls whose usage the provider did not report (estimated or charged their reservation).", []string{"tenant", "model"}, nil),
	}
}

// billingRecord is a settled call as a JSON line.
type billingRecord struct {
	At       time.Time        `json:"at"`
	Tenant   string           `json:"tenant"`
	User     string           `json:"user,omitempty"`
	Model    string           `json:"model"`
	API      string           `json:"api"`
	Status   int              `json:"status"`
	Tokens   map[string]int64 `json:"tokens"`
	Cost     string           `json:"cost,omitempty"`
	Currency string           `json:"currency,omitempty"`
	Reported bool             `json:"reported"`
	// ServiceTier is the tier the call was priced at, when not the
	// default.
	ServiceTier string `json:"service_tier,omitempty"`
}

func tokenMap(t policy.Tokens) map[string]int64 {
	m := make(map[string]int64, len(t))
	for k, n := range t {
		m[policy.TokenKindNames[k]] = n
	}
	return m
}

func (m *llmMeter) record(r *llm.Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := llmKey{r.Tenant, r.Model}
	row := m.rows[k]
	if row == nil {
		if len(m.rows) >= maxLLMRows-1 { // the last row is "(other)"
			k = llmKey{"(other)", "(other)"}
			row = m.rows[k]
		}
		if row == nil {
			row = &llmRow{}
			m.rows[k] = row
		}
	}
	if m.store != nil && len(m.pending) < maxPending {
		rec := *r
		rec.Model = k.model // within the bound of model names
		if k.tenant == "(other)" {
			rec.Model = "(other)"
		}
		m.pending = append(m.pending, &rec)
	}
	row.requests++
	if !r.Reported {
		row.unreported++
	}
	for i, n := range r.Usage {
		row.tokens[i] += n
	}
	row.cost += r.Cost
	if m.records != nil {
		rec := billingRecord{At: r.At.UTC(), Tenant: r.Tenant, User: r.User, Model: r.Model, API: r.API.String(),
			Status: r.Status, Tokens: tokenMap(r.Usage), Reported: r.Reported, ServiceTier: r.ServiceTier}
		if r.Priced {
			rec.Cost, rec.Currency = policy.FormatDecimal(r.Cost, 6), m.currency
		}
		b, _ := json.Marshal(rec)
		_, _ = m.records.Write(append(b, '\n'))
	}
}

// maxPending bounds the calls waiting to be added to the usage store: a
// store down for long loses the oldest minute's worth, not the process's
// memory.
const maxPending = 100_000

// flush adds the pending calls to the usage store.
func (m *llmMeter) flush(ctx context.Context) error {
	m.flushMu.Lock() // one flush at a time, in order
	defer m.flushMu.Unlock()
	m.mu.Lock()
	batch := m.pending
	m.pending = nil
	m.mu.Unlock()
	if len(batch) == 0 || m.store == nil {
		return nil
	}
	if err := m.store.Add(ctx, batch); err != nil {
		m.mu.Lock()
		if len(m.pending)+len(batch) <= maxPending {
			m.pending = append(batch, m.pending...) // retried at the next flush
		}
		m.mu.Unlock()
		return err
	}
	return nil
}

// flushEvery flushes every interval until ctx ends, then once more.
func (m *llmMeter) flushEvery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := m.flush(fctx); err != nil {
				m.log.Error("llm usage: the last calls could not be stored", "err", err)
			}
			cancel()
			return
		case <-t.C:
			if err := m.flush(ctx); err != nil {
				m.log.Warn("llm usage: storing calls failed; retrying", "err", err)
			}
		}
	}
}

// Describe implements prometheus.Collector.
func (m *llmMeter) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.requests
	ch <- m.tokens
	ch <- m.cost
	ch <- m.unreported
	ch <- m.searches
}

// Collect implements prometheus.Collector.
func (m *llmMeter) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, row := range m.rows {
		ch <- prometheus.MustNewConstMetric(m.requests, prometheus.CounterValue, float64(row.requests), k.tenant, k.model)
		ch <- prometheus.MustNewConstMetric(m.unreported, prometheus.CounterValue, float64(row.unreported), k.tenant, k.model)
		ch <- prometheus.MustNewConstMetric(m.cost, prometheus.CounterValue, float64(row.cost)/1e6, k.tenant, k.model, m.currency)
		for i, n := range row.tokens[:policy.WebSearch] {
			ch <- prometheus.MustNewConstMetric(m.tokens, prometheus.CounterValue, float64(n), k.tenant, k.model, policy.TokenKindNames[i])
		}
		ch <- prometheus.MustNewConstMetric(m.searches, prometheus.CounterValue, float64(row.tokens[policy.WebSearch]), k.tenant, k.model)
	}
}

// usageRow is one tenant and model's usage in the usage API.
type usageRow struct {
	Tenant     string           `json:"tenant"`
	Model      string           `json:"model"`
	Day        string           `json:"day,omitempty"`
	Requests   int64            `json:"requests"`
	Unreported int64            `json:"unreported"`
	Tokens     map[string]int64 `json:"tokens"`
	Cost       string           `json:"cost"`
}

// usageHandler serves GET /v1/llm/usage: without a tenant, every tenant
// and model's tokens by kind and cost since this proxy started; with
// ?tenant=ID[&from=DAY&to=DAY] (UTC days, to included; default today),
// that tenant's days from the usage store, which every proxy of the
// deployment adds to.
func (m *llmMeter) usageHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		tenant := q.Get("tenant")
		var days []llm.DayUsage
		if tenant == "" {
			m.mu.Lock()
			for k, row := range m.rows {
				days = append(days, llm.DayUsage{Tenant: k.tenant, Model: k.model, Requests: row.requests, Unreported: row.unreported,
					Tokens: row.tokens, Cost: row.cost})
			}
			m.mu.Unlock()
		} else {
			today := time.Now().UTC().Truncate(24 * time.Hour)
			from, to := today, today
			for _, f := range []struct {
				name string
				dst  *time.Time
			}{{"from", &from}, {"to", &to}} {
				if v := q.Get(f.name); v != "" {
					d, err := time.Parse(time.DateOnly, v)
					if err != nil {
						problem.Write(w, http.StatusBadRequest, f.name+": want a day like 2026-03-01")
						return
					}
					*f.dst = d
				}
			}
			if to.Before(from) || to.Sub(from) > 400*24*time.Hour {
				problem.Write(w, http.StatusBadRequest, "from and to: at most 400 days, from first")
				return
			}
			err := m.flush(r.Context())
			if err == nil {
				days, err = m.store.Usage(r.Context(), tenant, from, to.AddDate(0, 0, 1))
			}
			if err != nil {
				problem.Write(w, http.StatusServiceUnavailable, "the usage store did not answer: "+err.Error())
				return
			}
		}
		llm.SortUsage(days)
		rows := make([]usageRow, len(days))
		for i, d := range days {
			rows[i] = usageRow{Tenant: d.Tenant, Model: d.Model, Day: d.Day, Requests: d.Requests, Unreported: d.Unreported,
				Tokens: tokenMap(d.Tokens), Cost: policy.FormatDecimal(d.Cost, 6)}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"currency": m.currency, "usage": rows})
	})
}

//go:embed llmdashboard.html
var llmDashboard []byte

// llmDashboardHandler serves the LLM usage panel: every tenant and model's
// tokens by kind and cost, refreshed from /v1/llm/usage.
func llmDashboardHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
		_, _ = w.Write(llmDashboard)
	})
}

// usageGuard serves h, every tenant's usage, only to the platform: with a
// token (server.admin_token or ADMIT_ADMIN_TOKEN) to callers that present
// it as Authorization: Bearer, else to callers on the proxy's own host
// (loopback), as the dashboard on a developer's machine is. A tenant that
// reaches the metrics address reads no one's usage.
func usageGuard(token string, h http.Handler) http.Handler {
	sum := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token == "" {
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			if ip, err := netip.ParseAddr(host); err != nil || !ip.Unmap().IsLoopback() {
				problem.Write(w, http.StatusForbidden, "the usage API answers only callers on this host unless a token is set (server.admin_token or ADMIT_ADMIN_TOKEN)")
				return
			}
			h.ServeHTTP(w, r)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if g := sha256.Sum256([]byte(got)); !ok || subtle.ConstantTimeCompare(g[:], sum[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="admit"`)
			problem.Write(w, http.StatusUnauthorized, "the usage API needs the admin token as Authorization: Bearer")
			return
		}
		h.ServeHTTP(w, r)
	})
}
