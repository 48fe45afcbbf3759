package bench

import (
	"math"
	"slices"
)

// Dist summarises a lateness (or latency) distribution, in milliseconds.
type Dist struct {
	Count int     `json:"count"`
	Min   float64 `json:"min_ms"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p99_9_ms"`
	Max   float64 `json:"max_ms"`
	// Curve is the percentile curve, for plots: about 50 points per
	// decade of 1/(1-p), from p = 0 up to the last sample.
	Curve []CurvePoint `json:"curve,omitempty"`
}

// CurvePoint is one point of a percentile curve.
type CurvePoint struct {
	P  float64 `json:"p"` // 0 ≤ p ≤ 1
	Ms float64 `json:"ms"`
}

// ShardDist is the lateness of the tasks of one shard.
type ShardDist struct {
	Shard int     `json:"shard"`
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// distOf summarises samples in µs; it sorts a copy.
func distOf(samplesUs []int32) Dist {
	s := slices.Clone(samplesUs)
	slices.Sort(s)
	return distSorted(s, true)
}

// distOrNil is distOf, with the curve or not, or nil for no samples: a
// view that was not measured.
func distOrNil(samplesUs []int32, curve bool) *Dist {
	if len(samplesUs) == 0 {
		return nil
	}
	if curve {
		d := distOf(samplesUs)
		return &d
	}
	d := distNoCurve(samplesUs)
	return &d
}

// distNoCurve is distOf without the percentile curve.
func distNoCurve(samplesUs []int32) Dist {
	s := slices.Clone(samplesUs)
	slices.Sort(s)
	return distSorted(s, false)
}

func distSorted(s []int32, curve bool) Dist {
	n := len(s)
	if n == 0 {
		return Dist{}
	}
	var sum float64
	for _, v := range s {
		sum += float64(v)
	}
	d := Dist{
		Count: n, Min: ms(s[0]), Mean: sum / float64(n) / 1000,
		P50: ms(quantile(s, 0.50)), P90: ms(quantile(s, 0.90)), P99: ms(quantile(s, 0.99)),
		P999: ms(quantile(s, 0.999)), Max: ms(s[n-1]),
	}
	if curve {
		d.Curve = curveOf(s)
	}
	return d
}

// quantile is the nearest-rank quantile of sorted s: the smallest value
// with at least q of the samples at or below it.
func quantile(s []int32, q float64) int32 {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func curveOf(s []int32) []CurvePoint {
	n := len(s)
	top := math.Log10(float64(n)) // p = 1 - 1/n, the last sample's rank
	var out []CurvePoint
	for x := 0.0; x < top; x += 0.02 {
		p := 1 - math.Pow(10, -x)
		out = append(out, CurvePoint{P: round6(p), Ms: ms(quantile(s, p))})
	}
	return append(out, CurvePoint{P: 1, Ms: ms(s[n-1])})
}

// shardDists returns the lateness per shard, every shard listed.
func shardDists(lateUs []int32, shardOf []uint16, shards int) []ShardDist {
	per := make([][]int32, shards)
	for i, v := range lateUs {
		per[shardOf[i]] = append(per[shardOf[i]], v)
	}
	out := make([]ShardDist, shards)
	for i, s := range per {
		out[i].Shard = i
		if len(s) == 0 {
			continue
		}
		slices.Sort(s)
		d := distSorted(s, false)
		out[i] = ShardDist{Shard: i, Count: d.Count, P50: d.P50, P99: d.P99, Max: d.Max}
	}
	return out
}

// shardSpread returns the median and the worst of the shards' p99.
func shardSpread(sd []ShardDist) (median, worst float64, worstShard int) {
	var p99s []float64
	for _, s := range sd {
		if s.Count == 0 {
			continue
		}
		p99s = append(p99s, s.P99)
		if s.P99 > worst {
			worst, worstShard = s.P99, s.Shard
		}
	}
	if len(p99s) == 0 {
		return 0, 0, 0
	}
	slices.Sort(p99s)
	return p99s[(len(p99s)-1)/2], worst, worstShard
}

func ms(us int32) float64 { return float64(us) / 1000 }

func round6(v float64) float64 { return math.Round(v*1e6) / 1e6 }
