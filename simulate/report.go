package simulate

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
)

// Formats of a run's summary.
const (
	FormatText = "text"
	FormatCSV  = "csv"
	FormatJSON = "json"
)

// laneReport is a lane's summary as scripts read it.
type laneReport struct {
	Rule      string `json:"rule"`
	Algorithm string `json:"algorithm"`
	Describe  string `json:"describe"`
	Summary
	PeriodMS int64  `json:"period_ms"`
	Focus    string `json:"focus,omitempty"`
}

type report struct {
	Start      time.Time    `json:"start"`
	DurationMS int64        `json:"duration_ms"`
	Requests   int          `json:"requests"`
	Rules      []laneReport `json:"rules"`
}

func reportOf(r *Result) report {
	out := report{Start: r.Start, DurationMS: r.Duration.Milliseconds(), Requests: r.Requests}
	for _, l := range r.Lanes {
		out.Rules = append(out.Rules, laneReport{
			Rule: l.Rule.Name, Algorithm: l.Rule.Algorithm.String(), Describe: Describe(l.Rule),
			Summary: l.Summary, PeriodMS: l.Summary.Period.Milliseconds(), Focus: l.Focus,
		})
	}
	return out
}

// WriteSummary writes what each rule did, as text (a table), CSV (a
// header and one line per rule) or JSON.
func WriteSummary(w io.Writer, r *Result, format string) error {
	rep := reportOf(r)
	switch format {
	case FormatJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	case FormatCSV:
		cw := csv.NewWriter(w)
		_ = cw.Write([]string{"rule", "algorithm", "describe", "requests", "admitted", "refused", "refused_by_other_rules", "longest_refused_streak", "most_admitted_in_period", "period_ms"})
		for _, l := range rep.Rules {
			i := func(v int64) string { return strconv.FormatInt(v, 10) }
			_ = cw.Write([]string{l.Rule, l.Algorithm, l.Describe, i(l.Requests), i(l.Admitted), i(l.Refused), i(l.RefusedByOther), i(l.LongestRefusedStreak), i(l.MostInPeriod), i(l.PeriodMS)})
		}
		cw.Flush()
		return cw.Error()
	case FormatText, "":
		fmt.Fprintf(w, "%d requests over %s\n\n", r.Requests, r.Duration)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "RULE\tLIMIT\tADMITTED\tREFUSED\tBY OTHERS\tLONGEST REFUSED\tMOST ADMITTED")
		for _, l := range r.Lanes {
			s := l.Summary
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", l.Rule.Name, Describe(l.Rule), s.Admitted, s.Refused, s.RefusedByOther, s.LongestRefusedStreak, mostLine(l))
		}
		return tw.Flush()
	}
	return fmt.Errorf("format %q: want text, csv or json", format)
}
