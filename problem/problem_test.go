package problem

import (
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/admitdev/admit"
)

// TestRefusal: a refused decision is a quota-exceeded problem naming the
// limits that refused it, not its shadow ones nor its debits, with the
// longest wait's limit and the wait rounded up to milliseconds.
func TestRefusal(t *testing.T) {
	d := &admit.Decision{DeniedBy: "hourly", RetryAfter: 1500*time.Microsecond + 1, Results: []admit.Result{
		{Rule: "burst", Allowed: false},
		{Rule: "ok", Allowed: true},
		{Rule: "watching", Shadow: true},
		{Rule: "spent", Debit: true},
		{Rule: "hourly", Allowed: false},
	}}
	w := httptest.NewRecorder()
	WriteDetails(w, Refusal(d, "rate limited"))
	var got map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"type": QuotaExceeded, "title": "Quota exceeded", "status": float64(429), "detail": "rate limited",
		"violated-policies": []any{"burst", "hourly"}, "retry_after_ms": float64(2), "denied_by": "hourly",
	}
	if !reflect.DeepEqual(got, want) || w.Code != 429 || w.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("%d %s %s, want %v", w.Code, w.Header().Get("Content-Type"), w.Body, want)
	}
	// A summary without Results names DeniedBy; an admitted decision none.
	if v := Violated(&admit.Decision{DeniedBy: "x"}); !reflect.DeepEqual(v, []string{"x"}) {
		t.Errorf("Violated of a summary = %q", v)
	}
	if v := Violated(&admit.Decision{Allowed: true}); v != nil {
		t.Errorf("Violated of an admission = %q", v)
	}
	if p := RefusalBy("tenant_sessions", nil, time.Second, ""); !reflect.DeepEqual(p.ViolatedPolicies, []string{"tenant_sessions"}) || *p.RetryAfterMS != 1000 {
		t.Errorf("RefusalBy = %+v", p)
	}
	if Title(AbnormalUsageDetected, 429) != "Abnormal usage detected" || Title("about:blank", 404) != "Not Found" {
		t.Error("Title")
	}
}
