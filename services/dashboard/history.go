package dashboard

import (
	"fmt"
	"strings"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// The failure tolerance over time: the status part samples the consensus
// status it polls anyway into a ring of bounded size, kept in memory only
// (a restarted dashboard starts with an empty chart), and the pages draw
// it as a step chart, server-side, in inline SVG.

// maxSamples bounds the ring whatever --history and --refresh say.
const maxSamples = 10000

// ring keeps the newest cap values pushed, oldest first.
type ring[T any] struct {
	buf   []T
	start int // index of the oldest value once full
	full  bool
}

func newRing[T any](capacity int) *ring[T] {
	return &ring[T]{buf: make([]T, 0, max(capacity, 1))}
}

// push adds v, dropping the oldest value when the ring is full.
func (r *ring[T]) push(v T) {
	if !r.full {
		r.buf = append(r.buf, v)
		r.full = len(r.buf) == cap(r.buf)
		return
	}
	r.buf[r.start] = v
	r.start = (r.start + 1) % len(r.buf)
}

// len is how many values the ring holds.
func (r *ring[T]) len() int { return len(r.buf) }

// last is the newest value (false: none yet).
func (r *ring[T]) last() (T, bool) {
	var zero T
	if len(r.buf) == 0 {
		return zero, false
	}
	if !r.full {
		return r.buf[len(r.buf)-1], true
	}
	return r.buf[(r.start+len(r.buf)-1)%len(r.buf)], true
}

// slice is a copy of the values, oldest first.
func (r *ring[T]) slice() []T {
	out := make([]T, 0, len(r.buf))
	out = append(out, r.buf[r.start:]...)
	return append(out, r.buf[:r.start]...)
}

// sample is the consensus status at one time.
type sample struct {
	Time      time.Time `json:"time"`
	Voters    uint32    `json:"voters"`
	Learners  uint32    `json:"learners"`
	Healthy   uint32    `json:"healthy_voters"`
	Quorum    uint32    `json:"quorum"`
	Tolerance int32     `json:"failure_tolerance"`
}

// sampleOf is the sample of a consensus status taken at t.
func sampleOf(t time.Time, cons *curatorv1.GetConsensusStatusResponse) sample {
	s := sample{Time: t, Voters: cons.GetVoters(), Healthy: cons.GetHealthyVoters(), Quorum: cons.GetQuorum(), Tolerance: cons.GetFailureTolerance()}
	for _, m := range cons.GetMembers() {
		if m.GetLearner() {
			s.Learners++
		}
	}
	return s
}

// sameCounts says whether a and b differ in nothing but time.
func sameCounts(a, b sample) bool {
	a.Time = b.Time
	return a == b
}

// history is the ring of samples and how it is fed: a sample at most
// every period, unless the counts changed (a step is never missed, however
// short).
type history struct {
	period, window time.Duration
	samples        *ring[sample]
}

func newHistory(period, window time.Duration) *history {
	n := min(int(window/period)+1, maxSamples)
	return &history{period: period, window: window, samples: newRing[sample](n)}
}

// add records s when a period passed since the last sample or the counts
// changed; it reports whether it did.
func (h *history) add(s sample) bool {
	if last, ok := h.samples.last(); ok && sameCounts(last, s) && s.Time.Sub(last.Time) < h.period {
		return false
	}
	h.samples.push(s)
	return true
}

// within is the samples of the window up to now, oldest first.
func within(samples []sample, window time.Duration, now time.Time) []sample {
	from := now.Add(-window)
	for i, s := range samples {
		if !s.Time.Before(from) {
			return samples[i:]
		}
	}
	return nil
}

// chartData is a step chart of the samples: one polyline per series, in
// SVG user units (width × height), time left to right.
type chartData struct {
	Width, Height    int
	Samples          int
	From, To         string // the first and last sample's clock time
	Tolerance        string // polyline points
	Voters, Learners string
	Max, Min         int64 // the y axis' range
	YMax, YZero      int   // y of Max and of 0
	Now              sample
}

const (
	chartWidth  = 600
	chartHeight = 90
	chartPad    = 6
)

// chartOf draws the samples (oldest first) as step lines; an empty chart
// has Samples 0.
func chartOf(samples []sample) chartData {
	c := chartData{Width: chartWidth, Height: chartHeight, Samples: len(samples)}
	if len(samples) == 0 {
		return c
	}
	first, last := samples[0], samples[len(samples)-1]
	c.Now = last
	c.From, c.To = first.Time.Local().Format("15:04:05"), last.Time.Local().Format("15:04:05")
	c.Min, c.Max = 0, 1
	for _, s := range samples {
		c.Min = min(c.Min, int64(s.Tolerance))
		c.Max = max(c.Max, int64(s.Tolerance), int64(s.Voters), int64(s.Learners))
	}
	span := last.Time.Sub(first.Time)
	x := func(t time.Time) int {
		return chartPad + int(float64(chartWidth-2*chartPad)*float64(t.Sub(first.Time))/float64(span))
	}
	y := func(v int64) int {
		return chartHeight - chartPad - int(float64(chartHeight-2*chartPad)*float64(v-c.Min)/float64(c.Max-c.Min))
	}
	c.YMax, c.YZero = y(c.Max), y(0)
	line := func(v func(sample) int64) string {
		prev := v(first)
		if span <= 0 { // one sample, or several at one time: a flat line
			return fmt.Sprintf("%d,%d %d,%d", chartPad, y(prev), chartWidth-chartPad, y(prev))
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%d,%d", x(first.Time), y(prev))
		for _, s := range samples[1:] {
			if cur := v(s); cur != prev {
				// A step: along at the old value, then up or down.
				fmt.Fprintf(&b, " %d,%d %d,%d", x(s.Time), y(prev), x(s.Time), y(cur))
				prev = cur
			}
		}
		if end := fmt.Sprintf(" %d,%d", x(last.Time), y(prev)); !strings.HasSuffix(b.String(), end) {
			b.WriteString(end)
		}
		return b.String()
	}
	c.Tolerance = line(func(s sample) int64 { return int64(s.Tolerance) })
	c.Voters = line(func(s sample) int64 { return int64(s.Voters) })
	c.Learners = line(func(s sample) int64 { return int64(s.Learners) })
	return c
}
