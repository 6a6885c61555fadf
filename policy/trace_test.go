package policy_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/storetest"
)

// traced returns a Decider over a Faulty memory store that traces its
// store calls as Redis's, with the recorder of its spans.
func traced(t *testing.T) (*policy.Decider, *storetest.Faulty, *tracetest.SpanRecorder, trace.TracerProvider) {
	t.Helper()
	mem := memstore.New(nil)
	t.Cleanup(func() { mem.Close() })
	store := &storetest.Faulty{Store: mem}
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	d := policy.NewDecider(store, 1)
	d.Trace(tp, "redis")
	t.Cleanup(func() { d.Close() })
	return d, store, sr, tp
}

func oneCharge(onError admit.FailureMode) *policy.Resolution {
	r := &policy.Rule{Rule: admit.Rule{Name: "per-user", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 10, Per: 1e9}, Burst: 10, OnError: onError}}
	return &policy.Resolution{Charges: []admit.Charge{{Key: "k", Rule: &r.Rule, Cost: 1}}, Rules: []*policy.Rule{r}}
}

func TestStoreSpanIsTheDecisionsChild(t *testing.T) {
	d, store, sr, tp := traced(t)
	ctx, parent := tp.Tracer("test").Start(context.Background(), "decision")
	var dec admit.Decision
	if _, err := d.Decide(ctx, oneCharge(admit.FailOpen), &dec); err != nil || !dec.Allowed {
		t.Fatal(dec, err)
	}
	store.Down.Store(true)
	if out, err := d.Decide(ctx, oneCharge(admit.FailOpen), &dec); err != nil || out != policy.FailedOpen {
		t.Fatal(out, err)
	}
	parent.End()

	ended := sr.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans, want two store calls and their decision", len(ended))
	}
	for i, s := range ended[:2] {
		if s.Name() != "admit.store.decide" || s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanKind() != trace.SpanKindClient {
			t.Errorf("span %d: %q, parent %v, kind %v", i, s.Name(), s.Parent().SpanID(), s.SpanKind())
		}
		a := map[string]string{}
		for _, kv := range s.Attributes() {
			a[string(kv.Key)] = kv.Value.String()
		}
		if a["admit.store"] != "redis" || a["db.system.name"] != "redis" || a["admit.charges"] != "1" {
			t.Errorf("span %d: attributes %v", i, a)
		}
		failed := s.Status().Code == codes.Error
		if failed != (i == 1) || failed && a["error.type"] != "unavailable" {
			t.Errorf("span %d: status %v, error.type %q", i, s.Status(), a["error.type"])
		}
	}
}

// TestNoStoreSpanOutsideATrace: a decision no front end traces (its
// context holds no recording span) makes no store span.
func TestNoStoreSpanOutsideATrace(t *testing.T) {
	d, _, sr, _ := traced(t)
	var dec admit.Decision
	if _, err := d.Decide(context.Background(), oneCharge(admit.FailOpen), &dec); err != nil {
		t.Fatal(err)
	}
	if _, err := d.RenewLease(context.Background(), "nope"); err == nil {
		t.Fatal("renewed a lease that does not exist")
	}
	if n := len(sr.Ended()); n != 0 {
		t.Errorf("%d spans", n)
	}
}

func TestOutcomeNames(t *testing.T) {
	for out, want := range map[policy.Outcome]string{policy.Stored: "stored", policy.FailedOpen: "failed_open", policy.FailedLocal: "failed_local", 9: "outcome(9)"} {
		if got := out.String(); got != want {
			t.Errorf("%d: %q, want %q", out, got, want)
		}
	}
}
