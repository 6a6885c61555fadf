package simulate

import (
	"fmt"
	"image"
	"image/color"
	"image/color/palette"
	stddraw "image/draw"
	"image/gif"
	"io"
	"math"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/admitdev/admit"
)

// The pictures are drawn with gonum/plot: its axes, ticks, legends and
// text layout are what a timeline needs, and it writes SVG and PNG from
// one drawing, so both formats show the same thing.

var (
	green = color.RGBA{R: 0x2e, G: 0x9e, B: 0x44, A: 0xff}
	red   = color.RGBA{R: 0xd6, G: 0x2d, B: 0x20, A: 0xff}
	grey  = color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff}
	blue  = color.RGBA{R: 0x1f, G: 0x5f, B: 0xbf, A: 0xff}
)

// Size is a picture's size in pixels (at 96 dots per inch).
type Size struct{ Width, Height int }

// DefaultSize is the size of a picture of lanes lanes.
func DefaultSize(lanes int) Size { return Size{Width: 1000, Height: 40 + 250*lanes} }

const dpi = 96

func px(n int) vg.Length { return vg.Length(n) * vg.Inch / dpi }

// timeUnit picks the unit of the time axis for a run of d.
func timeUnit(d time.Duration) (time.Duration, string) {
	switch {
	case d <= 5*time.Minute:
		return time.Second, "s"
	case d <= 5*time.Hour:
		return time.Minute, "min"
	case d <= 5*24*time.Hour:
		return time.Hour, "h"
	}
	return 24 * time.Hour, "d"
}

// maxMarks is the most requests drawn one by one; beyond it a lane draws
// one mark per slice of time, red when any request in it was refused.
const maxMarks = 2000

// plots draws r's lanes as they stood at cutoff (the whole run when cutoff
// is r.Duration): one plot per lane, the requests as marks along the top,
// the state as a line below.
func plots(r *Result, cutoff time.Duration) ([]lanePlot, error) {
	div, name := timeUnit(r.Duration)
	x := func(d time.Duration) float64 { return float64(d) / float64(div) }
	var out []lanePlot
	for i, l := range r.Lanes {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s — %s\n%s", l.Rule.Name, Describe(l.Rule), summaryLine(l))
		p.Title.TextStyle.Font.Size = vg.Points(11)
		p.X.Min, p.X.Max = 0, x(r.Duration)
		if i == len(r.Lanes)-1 {
			p.X.Label.Text = "time (" + name + ")"
		}
		p.Y.Label.Text = l.Unit
		if l.Focus != "" {
			p.Y.Label.Text += " · " + l.Focus
		}
		capacity := float64(l.Rule.Capacity())
		top := 1.0
		for _, pt := range l.Points {
			top = max(top, pt.Level)
		}
		top = max(top, capacity)
		// Requests at the same instant are stacked, up to maxStack high.
		const maxStack = 8
		stack := 1
		for j, run := 1, 1; j < len(l.At) && len(l.At) <= maxMarks; j++ {
			if l.At[j] == l.At[j-1] {
				run++
			} else {
				run = 1
			}
			stack = max(stack, min(run, maxStack))
		}
		band, gap := top*1.18, top*0.1
		p.Y.Min, p.Y.Max = 0, band+float64(stack-1)*gap+top*0.12
		p.Y.Tick.Marker = capped{top}
		leg := plot.NewLegend()
		leg.Top, leg.Left = true, true
		leg.TextStyle.Font.Size = vg.Points(10)

		var line plotter.XYs
		for _, pt := range l.Points {
			if pt.At > cutoff {
				break
			}
			line = append(line, plotter.XY{X: x(pt.At), Y: pt.Level})
		}
		if len(line) > 0 {
			ln, err := plotter.NewLine(line)
			if err != nil {
				return nil, err
			}
			ln.LineStyle.Color, ln.LineStyle.Width = blue, vg.Points(1.5)
			ln.StepStyle = plotter.PostStep
			p.Add(ln)
			leg.Add(l.Unit, ln)
		}
		if capacity > 0 {
			limit, err := plotter.NewLine(plotter.XYs{{X: 0, Y: capacity}, {X: x(r.Duration), Y: capacity}})
			if err != nil {
				return nil, err
			}
			limit.LineStyle.Color, limit.LineStyle.Dashes = grey, []vg.Length{vg.Points(3), vg.Points(3)}
			p.Add(limit)
		}
		marks := [3]plotter.XYs{}
		if len(l.At) <= maxMarks {
			k := 0
			for j, at := range l.At {
				if at > cutoff {
					break
				}
				if j > 0 && at == l.At[j-1] {
					k = min(k+1, maxStack-1)
				} else {
					k = 0
				}
				marks[l.Outcomes[j]] = append(marks[l.Outcomes[j]], plotter.XY{X: x(at), Y: band + float64(k)*gap})
			}
		} else {
			// One mark per slice: refused if any request in it was.
			const slices = 400
			worst := make([]int8, slices)
			for j := range worst {
				worst[j] = -1
			}
			for j, at := range l.At {
				if at > cutoff {
					break
				}
				s := min(int(float64(at)/float64(r.Duration)*slices), slices-1)
				worst[s] = max(worst[s], int8(outcomeRank(l.Outcomes[j])))
			}
			for s, w := range worst {
				if w >= 0 {
					o := rankOutcome(w)
					marks[o] = append(marks[o], plotter.XY{X: x(r.Duration) * (float64(s) + 0.5) / slices, Y: band})
				}
			}
		}
		for o, xy := range marks {
			if len(xy) == 0 {
				continue
			}
			sc, err := plotter.NewScatter(xy)
			if err != nil {
				return nil, err
			}
			sc.GlyphStyle.Radius = vg.Points(3.2)
			switch Outcome(o) {
			case Admitted:
				sc.GlyphStyle.Color, sc.GlyphStyle.Shape = green, draw.BoxGlyph{}
				leg.Add("admitted", sc)
			case Refused:
				sc.GlyphStyle.Color, sc.GlyphStyle.Shape = red, draw.BoxGlyph{}
				leg.Add("refused", sc)
			case RefusedByOther:
				sc.GlyphStyle.Color, sc.GlyphStyle.Shape = grey, draw.BoxGlyph{}
				leg.Add("refused by another rule", sc)
			}
			p.Add(sc)
		}
		out = append(out, lanePlot{p, leg})
	}
	return out, nil
}

// lanePlot is a lane's plot and its legend, drawn beside it.
type lanePlot struct {
	*plot.Plot
	legend plot.Legend
}

// outcomeRank orders outcomes by how bad they are, for slices.
func outcomeRank(o Outcome) int {
	switch o {
	case Refused:
		return 2
	case RefusedByOther:
		return 1
	}
	return 0
}

func rankOutcome(r int8) Outcome {
	switch r {
	case 2:
		return Refused
	case 1:
		return RefusedByOther
	}
	return Admitted
}

// summaryLine is a lane's summary in one line.
func summaryLine(l *Lane) string {
	s := l.Summary
	line := fmt.Sprintf("%d requests: %d admitted, %d refused", s.Requests, s.Admitted, s.Refused)
	if s.RefusedByOther > 0 {
		line += fmt.Sprintf(", %d refused by other rules", s.RefusedByOther)
	}
	line += fmt.Sprintf(" · longest refused streak %d", s.LongestRefusedStreak)
	return line + " · " + mostLine(l)
}

func mostLine(l *Lane) string {
	s := l.Summary
	switch {
	case l.Rule.Algorithm == admit.Concurrency:
		return fmt.Sprintf("most held at once: %d", s.MostInPeriod)
	case s.Period == 0:
		return fmt.Sprintf("most admitted in a %s: %d", l.Rule.Period, s.MostInPeriod)
	}
	return fmt.Sprintf("most admitted in any %s: %d", fmtDuration(s.Period), s.MostInPeriod)
}

// capped ticks the state's axis up to the top of the state, leaving the
// band of request marks above it unlabelled.
type capped struct{ top float64 }

func (c capped) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for _, t := range (plot.DefaultTicks{}).Ticks(lo, c.top) {
		if t.Value <= c.top+1e-9 {
			if t.Label != "" {
				t.Label = strconv.FormatFloat(t.Value, 'g', 6, 64)
			}
			out = append(out, t)
		}
	}
	return out
}

// drawOn lays r's lanes out on a canvas of size, one above the other.
func drawOn(c vg.CanvasSizer, r *Result, cutoff time.Duration) error {
	ps, err := plots(r, cutoff)
	if err != nil {
		return err
	}
	grid := make([][]*plot.Plot, len(ps))
	for i, p := range ps {
		grid[i] = []*plot.Plot{p.Plot}
	}
	// The legends go in a strip on the right, out of the data's way.
	dc := draw.New(c)
	strip := vg.Points(130)
	w, _ := c.Size()
	plotArea := draw.Crop(dc, 0, -strip, 0, 0)
	tiles := draw.Tiles{Rows: len(ps), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(10), PadY: vg.Points(10)}
	for i, cv := range plot.Align(grid, tiles, plotArea) {
		ps[i].Draw(cv[0])
		lc := cv[0]
		lc.Min.X, lc.Max.X = w-strip, w
		lc = draw.Crop(lc, 0, 0, 0, -vg.Points(36)) // below the title
		ps[i].legend.Draw(lc)
	}
	return nil
}

// SVG writes r's picture as SVG.
func SVG(w io.Writer, r *Result, size Size) error {
	c := vgsvg.New(px(size.Width), px(size.Height))
	if err := drawOn(c, r, r.Duration); err != nil {
		return err
	}
	_, err := c.WriteTo(w)
	return err
}

func raster(r *Result, size Size, cutoff time.Duration) (*vgimg.Canvas, error) {
	c := vgimg.NewWith(vgimg.UseWH(px(size.Width), px(size.Height)), vgimg.UseDPI(dpi), vgimg.UseBackgroundColor(color.White))
	return c, drawOn(c, r, cutoff)
}

// PNG writes r's picture as PNG.
func PNG(w io.Writer, r *Result, size Size) error {
	c, err := raster(r, size, r.Duration)
	if err != nil {
		return err
	}
	_, err = vgimg.PngCanvas{Canvas: c}.WriteTo(w)
	return err
}

// GIF writes r as an animation of frames frames, each
// showing the run up to a later instant, the last held for 3 s.
func GIF(w io.Writer, r *Result, size Size, frames int) error {
	if frames < 2 {
		frames = 2
	}
	anim := &gif.GIF{}
	pal := append(palette.WebSafe[:len(palette.WebSafe):len(palette.WebSafe)], green, red, grey, blue)
	for f := 1; f <= frames; f++ {
		cutoff := time.Duration(math.Round(float64(r.Duration) * float64(f) / float64(frames)))
		c, err := raster(r, size, cutoff)
		if err != nil {
			return err
		}
		src := c.Image()
		frame := image.NewPaletted(src.Bounds(), pal)
		stddraw.Draw(frame, frame.Rect, src, src.Bounds().Min, stddraw.Src)
		anim.Image = append(anim.Image, frame)
		delay := 12
		if f == frames {
			delay = 300
		}
		anim.Delay = append(anim.Delay, delay)
	}
	return gif.EncodeAll(w, anim)
}
