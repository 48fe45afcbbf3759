package bench

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"strings"
)

// The lateness picture: one panel per mode, each a percentile plot (x:
// percentile on a "nines" scale, 1/(1-p) logarithmic, so the tail gets
// room; y: milliseconds, logarithmic), one line per point. Hand-written
// SVG, no dependency.

type series struct {
	label string
	dist  Dist
	// dispatch is a second view of the same point, drawn dashed in the
	// same colour (nil: none).
	dispatch *Dist
}

type panel struct {
	title  string
	series []series
}

const (
	svgWidth   = 960
	panelH     = 400
	marginL    = 70
	marginR    = 40
	marginT    = 40
	marginB    = 50
	minPlotted = 0.01 // ms; smaller values (and ≤ 0) sit on the axis
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

func panels(rep *Report) []panel {
	var out []panel
	if len(rep.Ceilings) > 0 {
		p := panel{title: "Raw broker (ceiling): consumer receipt minus publish time"}
		for _, c := range rep.Ceilings {
			p.series = append(p.series, series{fmt.Sprintf("size=%d%s %s", c.Size, c.form().formText(), c.QueueType), c.Latency, nil})
		}
		out = append(out, p)
	}
	titles := map[string]string{
		modeBacklog: "Backlog: consumer receipt minus due time (solid), x-published-us minus due time (dashed)",
		modeRate:    "Steady rate: consumer receipt minus due time (solid), x-published-us minus due time (dashed)",
	}
	for _, mode := range []string{modeBacklog, modeRate} {
		rs := results(rep, mode)
		if len(rs) == 0 {
			continue
		}
		p := panel{title: titles[mode]}
		for _, r := range rs {
			p.series = append(p.series, series{strings.TrimPrefix(strings.TrimPrefix(r.Point.String(), "backlog "), "rate "), r.Lateness, r.DispatchLateness})
		}
		out = append(out, p)
	}
	return out
}

func writeSVG(path string, rep *Report) error {
	if err := writeFile(path, renderSVG(panels(rep))); err != nil {
		return fmt.Errorf("write SVG: %w", err)
	}
	return nil
}

func renderSVG(ps []panel) []byte {
	var b bytes.Buffer
	h := max(len(ps), 1) * panelH
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, h, svgWidth, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	if len(ps) == 0 {
		fmt.Fprintf(&b, `<text x="20" y="40">no lateness measured</text>`+"\n")
	}
	for i, p := range ps {
		renderPanel(&b, p, float64(i*panelH))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

func renderPanel(b *bytes.Buffer, p panel, top float64) {
	x0, x1 := float64(marginL), float64(svgWidth-marginR)
	y0, y1 := top+marginT, top+panelH-marginB // y0 top of plot, y1 bottom
	// Ranges: x in nines up to the longest series; y in whole decades.
	maxX, lo, hi := 1.0, math.Inf(1), math.Inf(-1)
	for _, s := range p.series {
		for _, d := range s.dists() {
			if d.Count > 0 {
				maxX = max(maxX, math.Ceil(math.Log10(float64(d.Count))))
			}
			for _, c := range d.Curve {
				v := max(c.Ms, minPlotted)
				lo, hi = min(lo, v), max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	yLo, yHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if yHi <= yLo {
		yHi = yLo + 1
	}
	px := func(nines float64) float64 { return x0 + (x1-x0)*nines/maxX }
	py := func(ms float64) float64 {
		return y1 - (y1-y0)*(math.Log10(max(ms, minPlotted))-yLo)/(yHi-yLo)
	}

	fmt.Fprintf(b, `<text x="%g" y="%g" font-size="14" font-weight="bold">%s</text>`+"\n", x0, top+22, esc(p.title))
	fmt.Fprintf(b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#333"/>`+"\n", x0, y0, x1-x0, y1-y0)
	for n := 0.0; n <= maxX; n++ {
		x := px(n)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#ddd"/>`+"\n", x, y0, x, y1)
		fmt.Fprintf(b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`+"\n", x, y1+16, ninesLabel(n))
	}
	fmt.Fprintf(b, `<text x="%g" y="%g" text-anchor="middle">percentile</text>`+"\n", (x0+x1)/2, y1+36)
	for d := yLo; d <= yHi; d++ {
		y := py(math.Pow(10, d))
		fmt.Fprintf(b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x1, y)
		fmt.Fprintf(b, `<text x="%g" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-6, y+4, decadeLabel(d))
	}
	fmt.Fprintf(b, `<text x="16" y="%.1f" transform="rotate(-90 16 %.1f)" text-anchor="middle">ms</text>`+"\n", (y0+y1)/2, (y0+y1)/2)

	for i, s := range p.series {
		color := palette[i%len(palette)]
		for j, d := range s.dists() {
			var pts []string
			for _, c := range d.Curve {
				n := maxX
				if c.P < 1 {
					n = math.Log10(1 / (1 - c.P))
				} else if d.Count > 0 {
					n = math.Log10(float64(d.Count))
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(n), py(c.Ms)))
			}
			if len(pts) > 0 {
				fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5"%s points="%s"/>`+"\n", color, dashed(j), strings.Join(pts, " "))
			}
		}
	}
	// The legend sits bottom right, where a rising percentile curve is
	// not: a line per series, and one more for its dashed view.
	type entry struct {
		text  string
		color string
		dash  int
	}
	var legend []entry
	for i, s := range p.series {
		color := palette[i%len(palette)]
		legend = append(legend, entry{fmt.Sprintf("%s  (p50 %s, p99 %s, max %s ms)", s.label, fmtMs(s.dist.P50), fmtMs(s.dist.P99), fmtMs(s.dist.Max)), color, 0})
		if d := s.dispatch; d != nil {
			legend = append(legend, entry{fmt.Sprintf("dispatch view  (p50 %s, p99 %s, max %s ms)", fmtMs(d.P50), fmtMs(d.P99), fmtMs(d.Max)), color, 1})
		}
	}
	for i, e := range legend {
		ly := y1 - 10 - float64(len(legend)-1-i)*16
		w := 7*float64(len(e.text)) + 40 // generous width of the text at 12px, and the line
		fmt.Fprintf(b, `<rect x="%.1f" y="%g" width="%.1f" height="16" fill="white" fill-opacity="0.85"/>`+"\n", x1-4-w, ly-12, w)
		fmt.Fprintf(b, `<text x="%g" y="%g" text-anchor="end">%s</text>`+"\n", x1-36, ly, esc(e.text))
		fmt.Fprintf(b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="3"%s/>`+"\n", x1-30, ly-4, x1-10, ly-4, e.color, dashed(e.dash))
	}
}

// dists are the series' views to draw: the main one, then the dispatch
// view if any.
func (s series) dists() []Dist {
	if s.dispatch != nil {
		return []Dist{s.dist, *s.dispatch}
	}
	return []Dist{s.dist}
}

// dashed is the stroke attribute of a series' j-th view: solid, then
// dashed.
func dashed(j int) string {
	if j == 0 {
		return ""
	}
	return ` stroke-dasharray="6 3"`
}

// ninesLabel names the percentile 1 - 10^-n: 0%, 90%, 99%, 99.9%...
func ninesLabel(n float64) string {
	if n == 0 {
		return "0%"
	}
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.*f", int(n), 100*(1-math.Pow(10, -n))), "0"), ".") + "%"
}

func decadeLabel(d float64) string {
	v := math.Pow(10, d)
	if d < 0 {
		return fmt.Sprintf("%.*f", int(-d), v)
	}
	return thousands(int(v))
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
