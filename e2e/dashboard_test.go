package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// poll waits until the page's expression is true.
func poll(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(15*time.Second))
}

// TestDashboardPage uses the dashboard as an operator does: some traffic
// with refusals, the admin token typed in, the overview, the tenant
// refused most opened in the inspector, then the simulator, by rules and
// by a tenant's tier. Screenshots of each page are kept.
func TestDashboardPage(t *testing.T) {
	p := startAdmitEnv(t, []string{"ADMIT_ADMIN_TOKEN=dash-token"})
	for range 4 { // tenant-1's doc-summaries starts with 2 tokens
		resp, err := http.Post(p.url+"/v1/check", "application/json", strings.NewReader(`{"tenant":"tenant-1","user":"ann","action":"invoke-doc-summary-ai"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	ctx := browser(t)
	shots := map[string][]byte{}
	phases := []struct {
		shot    string
		actions []chromedp.Action[chromedp.Void]
	}{
		{"dashboard-overview.png", []chromedp.Action[chromedp.Void]{
			chromedp.Navigate(p.url + "/"),
			poll(`document.getElementById("error").textContent.includes("401")`),
			chromedp.SetValue(chromedp.ID("token"), "dash-token"),
			chromedp.Click(chromedp.ID("token-save")),
			poll(`document.getElementById("store").textContent === "ready"`),
			poll(`document.getElementById("top-refused").textContent.includes("tenant-1")`),
			poll(`[...document.querySelectorAll("#rule-charts .card")].some(c => c.dataset.name === "doc-summaries" && c.querySelector(".n-refused").textContent === "2")`),
			poll(`[...document.querySelectorAll("#endpoint-charts .card")].some(c => c.dataset.name === "check" && c.querySelector(".n-allowed").textContent === "2")`),
		}},
		{"dashboard-tenant.png", []chromedp.Action[chromedp.Void]{
			chromedp.Click(`#top-refused a`),
			poll(`document.getElementById("tenant-view").textContent.includes("tier free")`),
			poll(`document.getElementById("tenant-view").textContent.includes("doc-summaries")`),
			// The recent refusals name the user.
			poll(`document.getElementById("tenant-view").textContent.includes("ann")`),
		}},
		{"dashboard-simulator.png", []chromedp.Action[chromedp.Void]{
			chromedp.Click(chromedp.ID("tab-simulator")),
			chromedp.Click(chromedp.ID("sim-run")),
			poll(`(() => { const i = document.getElementById("sim-image"); return i && i.complete && i.naturalWidth === 1000 })()`),
		}},
		{"dashboard-simulator-tier.png", []chromedp.Action[chromedp.Void]{
			chromedp.SetValue(chromedp.ID("sim-tenant"), "t1234"),
			chromedp.SetValue(chromedp.ID("sim-action"), "invoke-doc-summary-ai"),
			chromedp.SetValue(chromedp.ID("sim-pattern"), "constant rate=1/30s duration=10m"),
			chromedp.Click(chromedp.ID("sim-run")),
			// The tier's rules: a lane each, a taller picture than three.
			poll(`(() => { const i = document.getElementById("sim-image"); return i && i.complete && i.naturalHeight > 1000 })()`),
		}},
	}
	var err error
	for _, ph := range phases {
		if err = chromedp.Do(ctx, ph.actions...); err != nil {
			break
		}
		if shots[ph.shot], err = chromedp.Run(ctx, chromedp.FullScreenshot(100)); err != nil {
			break
		}
	}
	errText, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("error")))
	for name, b := range shots {
		if len(b) > 0 {
			keep(t, name, b)
		}
	}
	if err != nil {
		t.Fatalf("%v\npage error: %q", err, errText)
	}
}

// TestDashboardTokenInAddress: the dashboard opened at /#token=… uses the
// token at once, and takes it out of the address bar.
func TestDashboardTokenInAddress(t *testing.T) {
	p := startAdmitEnv(t, []string{"ADMIT_ADMIN_TOKEN=dash-token"})
	ctx := browser(t)
	err := chromedp.Do(ctx,
		chromedp.Navigate(p.url+"/#token=dash-token"),
		poll(`document.getElementById("store").textContent === "ready"`),
		poll(`location.hash === "" && document.getElementById("token").value === "dash-token"`),
	)
	if err != nil {
		errText, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("error")))
		t.Fatalf("%v (the page says %q)", err, errText)
	}
}
