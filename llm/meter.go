package llm

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

	"github.com/admitdev/admit/problem"
	"github.com/admitdev/admit/units"
)

// MaxMeterRows bounds the tenant × model pairs a Meter keeps apart,
// "(other)" included, and so the label sets of its metrics: past it,
// calls are counted under tenant and model "(other)". Tenants choose
// model names.
const MaxMeterRows = 1000

// maxPending bounds the calls waiting to be added to the usage store: a
// store down for long loses the oldest minute's worth, not the process's
// memory.
const maxPending = 100_000

// MeterOptions configure a Meter.
type MeterOptions struct {
	// Currency names the prices' currency in metrics and the usage API
	// ("USD" when empty).
	Currency string
	// Records, when set, gets one JSON line per settled call: a billing
	// record.
	Records io.Writer
	// Store, when set, keeps the usage by day for every proxy of the
	// deployment; the Meter adds its calls to it at each Flush.
	Store UsageStore
	// Logger gets the usage store's failures (slog.Default() when nil).
	Logger *slog.Logger
}

// A Meter sums the calls a Gate settles (give its Record method as
// GateOptions.Record) per tenant and model since the process started:
// Prometheus metrics (it is a prometheus.Collector), the usage API and,
// with MeterOptions.Records, a billing record per call. With a
// MeterOptions.Store it adds the calls to the deployment's days too.
type Meter struct {
	currency string
	records  io.Writer
	store    UsageStore
	log      *slog.Logger

	mu      sync.Mutex
	rows    map[meterKey]*DayUsage
	pending []*Record // not yet added to store
	flushMu sync.Mutex

	requests, tokens, cost, unreported, searches *prometheus.Desc
}

var _ prometheus.Collector = (*Meter)(nil)

type meterKey struct{ tenant, model string }

// NewMeter returns a Meter that has counted nothing.
func NewMeter(o MeterOptions) *Meter {
	if o.Currency == "" {
		o.Currency = "USD"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	tm := []string{"tenant", "model"}
	return &Meter{
		currency: o.Currency, rows: map[meterKey]*DayUsage{}, records: o.Records, store: o.Store, log: o.Logger,
		requests:   prometheus.NewDesc("admit_llm_requests_total", "LLM calls settled, per tenant and model.", tm, nil),
		tokens:     prometheus.NewDesc("admit_llm_tokens_total", "LLM tokens used, per tenant, model and kind ("+strings.Join(units.TokenKindNames[:units.WebSearch], ", ")+").", []string{"tenant", "model", "kind"}, nil),
		searches:   prometheus.NewDesc("admit_llm_web_searches_total", "Web searches LLM calls ran at the provider, per tenant and model.", tm, nil),
		cost:       prometheus.NewDesc("admit_llm_cost_total", "What LLM calls cost at the configured prices, in the currency.", []string{"tenant", "model", "currency"}, nil),
		unreported: prometheus.NewDesc("admit_llm_unreported_total", "LLM calls whose usage the provider did not report (estimated or charged their reservation).", tm, nil),
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

func tokenMap(t units.Tokens) map[string]int64 {
	m := make(map[string]int64, len(t))
	for k, n := range t {
		m[units.TokenKindNames[k]] = n
	}
	return m
}

// Record counts a settled call.
func (m *Meter) Record(r *Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := meterKey{r.Tenant, r.Model}
	row := m.rows[k]
	if row == nil {
		if len(m.rows) >= MaxMeterRows-1 { // the last row is "(other)"
			k = meterKey{"(other)", "(other)"}
			row = m.rows[k]
		}
		if row == nil {
			row = &DayUsage{Tenant: k.tenant, Model: k.model}
			m.rows[k] = row
		}
	}
	if m.store != nil && len(m.pending) < maxPending {
		rec := *r
		rec.Model = k.model // within the bound of model names
		m.pending = append(m.pending, &rec)
	}
	row.Add(r)
	if m.records != nil {
		rec := billingRecord{At: r.At.UTC(), Tenant: r.Tenant, User: r.User, Model: r.Model, API: r.API.String(),
			Status: r.Status, Tokens: tokenMap(r.Usage), Reported: r.Reported, ServiceTier: r.ServiceTier}
		if r.Priced {
			rec.Cost, rec.Currency = units.FormatDecimal(r.Cost, 6), m.currency
		}
		b, _ := json.Marshal(rec)
		_, _ = m.records.Write(append(b, '\n'))
	}
}

// Flush adds the calls counted since the last Flush to the usage store.
// Calls it could not add are kept for the next, up to 100,000.
func (m *Meter) Flush(ctx context.Context) error {
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

// FlushEvery flushes every interval until ctx ends, then once more,
// within 5 seconds.
func (m *Meter) FlushEvery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := m.Flush(fctx); err != nil {
				m.log.Error("llm usage: the last calls could not be stored", "err", err)
			}
			cancel()
			return
		case <-t.C:
			if err := m.Flush(ctx); err != nil {
				m.log.Warn("llm usage: storing calls failed; retrying", "err", err)
			}
		}
	}
}

// Describe implements prometheus.Collector.
func (m *Meter) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.requests
	ch <- m.tokens
	ch <- m.cost
	ch <- m.unreported
	ch <- m.searches
}

// Collect implements prometheus.Collector.
func (m *Meter) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, row := range m.rows {
		ch <- prometheus.MustNewConstMetric(m.requests, prometheus.CounterValue, float64(row.Requests), k.tenant, k.model)
		ch <- prometheus.MustNewConstMetric(m.unreported, prometheus.CounterValue, float64(row.Unreported), k.tenant, k.model)
		ch <- prometheus.MustNewConstMetric(m.cost, prometheus.CounterValue, float64(row.Cost)/1e6, k.tenant, k.model, m.currency)
		for i, n := range row.Tokens[:units.WebSearch] {
			ch <- prometheus.MustNewConstMetric(m.tokens, prometheus.CounterValue, float64(n), k.tenant, k.model, units.TokenKindNames[i])
		}
		ch <- prometheus.MustNewConstMetric(m.searches, prometheus.CounterValue, float64(row.Tokens[units.WebSearch]), k.tenant, k.model)
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

// UsageHandler serves GET /v1/llm/usage: without a tenant, every tenant
// and model's tokens by kind and cost since this process started; with
// ?tenant=ID[&from=DAY&to=DAY] (UTC days, to included; default today),
// that tenant's days from the usage store, which every proxy of the
// deployment adds to.
//
// It answers only the platform, since it shows every tenant's usage:
// with an adminToken, callers that present it as Authorization: Bearer
// (others 401); without one, callers on this host (loopback; others 403),
// as a dashboard on a developer's machine is.
func (m *Meter) UsageHandler(adminToken string) http.Handler {
	return platformOnly(adminToken, http.HandlerFunc(m.serveUsage))
}

func (m *Meter) serveUsage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	tenant := q.Get("tenant")
	var days []DayUsage
	if tenant == "" {
		m.mu.Lock()
		for _, row := range m.rows {
			days = append(days, *row)
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
		if m.store == nil {
			problem.Write(w, http.StatusNotFound, "no usage store keeps days: ask without a tenant for this process's usage")
			return
		}
		err := m.Flush(r.Context())
		if err == nil {
			days, err = m.store.Usage(r.Context(), tenant, from, to.AddDate(0, 0, 1))
		}
		if err != nil {
			problem.Write(w, http.StatusServiceUnavailable, "the usage store did not answer: "+err.Error())
			return
		}
	}
	SortUsage(days)
	rows := make([]usageRow, len(days))
	for i, d := range days {
		rows[i] = usageRow{Tenant: d.Tenant, Model: d.Model, Day: d.Day, Requests: d.Requests, Unreported: d.Unreported,
			Tokens: tokenMap(d.Tokens), Cost: units.FormatDecimal(d.Cost, 6)}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"currency": m.currency, "usage": rows})
}

//go:embed dashboard.html
var dashboard []byte

// DashboardHandler serves the LLM usage panel: every tenant and model's
// tokens by kind and cost, refreshed from /v1/llm/usage beside it.
func DashboardHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
		_, _ = w.Write(dashboard)
	})
}

// platformOnly serves h only to the platform: with a token, to callers
// that present it as Authorization: Bearer, else to callers on this host.
// A tenant that reaches the address reads no one's usage.
func platformOnly(token string, h http.Handler) http.Handler {
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
