package main

import (
	_ "embed"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/policy"
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

	requests, tokens, cost, unreported *prometheus.Desc
}

func newLLMMeter(currency string, records io.Writer) *llmMeter {
	return &llmMeter{
		currency: currency, rows: map[llmKey]*llmRow{}, records: records,
		requests:   prometheus.NewDesc("admit_llm_requests_total", "LLM calls settled, per tenant and model.", []string{"tenant", "model"}, nil),
		tokens:     prometheus.NewDesc("admit_llm_tokens_total", "LLM tokens used, per tenant, model and kind (input, cached_input, cache_write, output, reasoning).", []string{"tenant", "model", "kind"}, nil),
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
			Status: r.Status, Tokens: tokenMap(r.Usage), Reported: r.Reported}
		if r.Priced {
			rec.Cost, rec.Currency = policy.FormatDecimal(r.Cost, 6), m.currency
		}
		b, _ := json.Marshal(rec)
		_, _ = m.records.Write(append(b, '\n'))
	}
}

// Describe implements prometheus.Collector.
func (m *llmMeter) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.requests
	ch <- m.tokens
	ch <- m.cost
	ch <- m.unreported
}

// Collect implements prometheus.Collector.
func (m *llmMeter) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, row := range m.rows {
		ch <- prometheus.MustNewConstMetric(m.requests, prometheus.CounterValue, float64(row.requests), k.tenant, k.model)
		ch <- prometheus.MustNewConstMetric(m.unreported, prometheus.CounterValue, float64(row.unreported), k.tenant, k.model)
		ch <- prometheus.MustNewConstMetric(m.cost, prometheus.CounterValue, float64(row.cost)/1e6, k.tenant, k.model, m.currency)
		for i, n := range row.tokens {
			ch <- prometheus.MustNewConstMetric(m.tokens, prometheus.CounterValue, float64(n), k.tenant, k.model, policy.TokenKindNames[i])
		}
	}
}

// usageRow is one tenant and model's usage in the usage API.
type usageRow struct {
	Tenant     string           `json:"tenant"`
	Model      string           `json:"model"`
	Requests   int64            `json:"requests"`
	Unreported int64            `json:"unreported"`
	Tokens     map[string]int64 `json:"tokens"`
	Cost       string           `json:"cost"`
}

// usageHandler serves GET /v1/llm/usage[?tenant=ID]: every tenant and
// model's tokens by kind and cost since the proxy started, sorted.
func (m *llmMeter) usageHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := r.URL.Query().Get("tenant")
		m.mu.Lock()
		rows := make([]usageRow, 0, len(m.rows))
		for k, row := range m.rows {
			if tenant != "" && k.tenant != tenant {
				continue
			}
			rows = append(rows, usageRow{Tenant: k.tenant, Model: k.model, Requests: row.requests, Unreported: row.unreported,
				Tokens: tokenMap(row.tokens), Cost: policy.FormatDecimal(row.cost, 6)})
		}
		m.mu.Unlock()
		slices.SortFunc(rows, func(a, b usageRow) int {
			if c := strings.Compare(a.Tenant, b.Tenant); c != 0 {
				return c
			}
			return strings.Compare(a.Model, b.Model)
		})
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
