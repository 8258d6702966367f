package dashboard

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

func TestRingBounds(t *testing.T) {
	for name, tc := range map[string]struct {
		capacity int
		push     []int
		want     []int
	}{
		"empty":                 {capacity: 3, want: []int{}},
		"not full":              {capacity: 3, push: []int{1, 2}, want: []int{1, 2}},
		"exactly full":          {capacity: 3, push: []int{1, 2, 3}, want: []int{1, 2, 3}},
		"one over":              {capacity: 3, push: []int{1, 2, 3, 4}, want: []int{2, 3, 4}},
		"wrapped twice":         {capacity: 3, push: []int{1, 2, 3, 4, 5, 6, 7}, want: []int{5, 6, 7}},
		"capacity 1":            {capacity: 1, push: []int{1, 2, 3}, want: []int{3}},
		"capacity 0 is 1":       {capacity: 0, push: []int{1, 2}, want: []int{2}},
		"many over a small cap": {capacity: 4, push: seq(1, 1000), want: []int{997, 998, 999, 1000}},
	} {
		t.Run(name, func(t *testing.T) {
			r := newRing[int](tc.capacity)
			for _, v := range tc.push {
				r.push(v)
				if r.len() > max(tc.capacity, 1) {
					t.Fatalf("ring of %d holds %d", tc.capacity, r.len())
				}
			}
			if got := r.slice(); !slices.Equal(got, tc.want) {
				t.Fatalf("slice = %v, want %v", got, tc.want)
			}
			last, ok := r.last()
			if ok != (len(tc.want) > 0) || (ok && last != tc.want[len(tc.want)-1]) {
				t.Fatalf("last = %d, %v; want the newest of %v", last, ok, tc.want)
			}
			// slice is a copy: changing it changes not the ring.
			if got := r.slice(); len(got) > 0 {
				got[0] = -1
				if r.slice()[0] == -1 {
					t.Fatal("slice shares the ring's buffer")
				}
			}
		})
	}
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func TestHistoryBoundsAndSampling(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	// 3 voters, quorum 2: healthy 3 is tolerance 1, healthy 2 is 0.
	at := func(d time.Duration, tolerance int32) sample {
		healthy := uint32(3)
		if tolerance == 0 {
			healthy = 2
		}
		return sample{Time: t0.Add(d), Voters: 3, Healthy: healthy, Quorum: 2, Tolerance: tolerance}
	}
	for name, tc := range map[string]struct {
		period, window time.Duration
		add            []sample
		wantCap        int
		want           []sample
	}{
		"one per period": {
			period: 2 * time.Second, window: time.Hour, wantCap: 1801,
			add:  []sample{at(0, 1), at(time.Second, 1), at(2*time.Second, 1), at(3*time.Second, 1)},
			want: []sample{at(0, 1), at(2*time.Second, 1)},
		},
		"a change is sampled at once": {
			period: 2 * time.Second, window: time.Hour, wantCap: 1801,
			add:  []sample{at(0, 1), at(100*time.Millisecond, 0), at(200*time.Millisecond, 1)},
			want: []sample{at(0, 1), at(100*time.Millisecond, 0), at(200*time.Millisecond, 1)},
		},
		"the window bounds the ring": {
			period: time.Second, window: 3 * time.Second, wantCap: 4,
			add:  []sample{at(0, 1), at(time.Second, 1), at(2*time.Second, 0), at(3*time.Second, 0), at(4*time.Second, 1), at(5*time.Second, 1)},
			want: []sample{at(2*time.Second, 0), at(3*time.Second, 0), at(4*time.Second, 1), at(5*time.Second, 1)},
		},
		"at most maxSamples": {
			period: time.Millisecond, window: 24 * time.Hour, wantCap: maxSamples,
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHistory(tc.period, tc.window)
			if c := cap(h.samples.buf); c != tc.wantCap {
				t.Fatalf("capacity %d, want %d", c, tc.wantCap)
			}
			for _, s := range tc.add {
				h.add(s)
			}
			if got := h.samples.slice(); !slices.Equal(got, tc.want) && len(tc.want) > 0 {
				t.Fatalf("samples\n%v\nwant\n%v", got, tc.want)
			}
		})
	}
}

func TestWithin(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	samples := []sample{{Time: t0}, {Time: t0.Add(time.Minute)}, {Time: t0.Add(2 * time.Minute)}}
	for name, tc := range map[string]struct {
		window time.Duration
		now    time.Time
		want   int
	}{
		"all":         {window: time.Hour, now: t0.Add(2 * time.Minute), want: 3},
		"the newest":  {window: 30 * time.Second, now: t0.Add(2 * time.Minute), want: 1},
		"on the edge": {window: time.Minute, now: t0.Add(2 * time.Minute), want: 2},
		"none":        {window: time.Minute, now: t0.Add(time.Hour), want: 0},
	} {
		t.Run(name, func(t *testing.T) {
			if got := within(samples, tc.window, tc.now); len(got) != tc.want {
				t.Fatalf("%d samples within %v of %v, want %d", len(got), tc.window, tc.now, tc.want)
			}
		})
	}
}

func TestSampleOf(t *testing.T) {
	now := time.Now()
	got := sampleOf(now, &curatorv1.GetConsensusStatusResponse{
		Voters: 3, HealthyVoters: 3, Quorum: 2, FailureTolerance: 1,
		Members: []*curatorv1.ConsensusMemberStatus{{MemberId: 1}, {MemberId: 2}, {MemberId: 3}, {MemberId: 4, Learner: true}},
	})
	if want := (sample{Time: now, Voters: 3, Learners: 1, Healthy: 3, Quorum: 2, Tolerance: 1}); got != want {
		t.Fatalf("sampleOf = %+v, want %+v", got, want)
	}
}

func TestChartOf(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := func(d time.Duration, voters, learners uint32, tolerance int32) sample {
		return sample{Time: t0.Add(d), Voters: voters, Learners: learners, Tolerance: tolerance}
	}
	for name, tc := range map[string]struct {
		samples        []sample
		wantTolerance  string
		wantLearners   string
		wantMin, wantM int64
	}{
		"no sample": {},
		"one sample: a flat line": {
			samples:       []sample{s(0, 3, 0, 1)},
			wantTolerance: "6,58 594,58", wantLearners: "6,84 594,84", wantMin: 0, wantM: 3,
		},
		"steps only where the value changes": {
			samples:       []sample{s(0, 3, 0, 1), s(time.Second, 3, 1, 1), s(2*time.Second, 4, 0, 0), s(4*time.Second, 4, 0, 0)},
			wantTolerance: "6,65 300,65 300,84 594,84", wantLearners: "6,84 153,84 153,65 300,65 300,84 594,84", wantMin: 0, wantM: 4,
		},
		"no quorum goes below zero": {
			samples:       []sample{s(0, 1, 0, 0), s(time.Second, 1, 0, -1)},
			wantTolerance: "6,45 594,45 594,84", wantMin: -1, wantM: 1,
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := chartOf(tc.samples)
			if c.Samples != len(tc.samples) {
				t.Fatalf("Samples %d, want %d", c.Samples, len(tc.samples))
			}
			if len(tc.samples) == 0 {
				if c.Tolerance != "" {
					t.Fatalf("an empty chart has a line: %q", c.Tolerance)
				}
				return
			}
			if c.Tolerance != tc.wantTolerance {
				t.Errorf("tolerance points %q, want %q", c.Tolerance, tc.wantTolerance)
			}
			if tc.wantLearners != "" && c.Learners != tc.wantLearners {
				t.Errorf("learners points %q, want %q", c.Learners, tc.wantLearners)
			}
			if c.Min != tc.wantMin || c.Max != tc.wantM {
				t.Errorf("y range %d..%d, want %d..%d", c.Min, c.Max, tc.wantMin, tc.wantM)
			}
			for _, p := range strings.Fields(c.Tolerance + " " + c.Voters + " " + c.Learners) {
				var x, y int
				if _, err := fmt.Sscanf(p, "%d,%d", &x, &y); err != nil || x < 0 || x > c.Width || y < 0 || y > c.Height {
					t.Errorf("point %q outside the %dx%d chart", p, c.Width, c.Height)
				}
			}
		})
	}
}

// TestHistoryRendering renders the chart and the maintenance notice as the
// cluster and membership pages do.
func TestHistoryRendering(t *testing.T) {
	p := newPages(&Dashboard{})
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	until := t0.Add(10 * time.Minute)
	for name, tc := range map[string]struct {
		template string
		data     liveData
		want     []string
		not      []string
	}{
		"no sample": {
			template: "chart", data: liveData{Chart: chartOf(nil)},
			want: []string{`id="tolerance-chart" class="chart" data-samples="0"`, "no consensus status sampled yet"},
			not:  []string{"<svg", "<polyline"},
		},
		"samples": {
			template: "chart",
			data:     liveData{Chart: chartOf([]sample{{Time: t0, Voters: 3, Tolerance: 1}, {Time: t0.Add(time.Second), Voters: 3, Learners: 1, Tolerance: 1}})},
			want: []string{
				`data-samples="2"`, `<svg viewBox="0 0 600 90"`,
				`<polyline class="voters" points="6,6 594,6"/>`, `<polyline class="learners" points="6,84 594,84 594,58"/>`, `<polyline class="tolerance" points="6,58 594,58"/>`,
				"(now 1)", "(3)", "(1)",
			},
		},
		"a voter in maintenance": {
			template: "maintenance",
			data:     liveData{Maintenance: []maintenanceRow{{Node: "node-1", Reason: "<upgrade>", By: "admin/ops", Voter: true, UntilText: "until-text", LeadershipTo: "b (node-2)"}}},
			want:     []string{`data-node="node-1" data-voter="true"`, "A voter is in maintenance:", "until-text", `<span class="reason">&lt;upgrade&gt;</span>`, `<span class="by">admin/ops</span>`, "etcd leadership moved to b (node-2)"},
		},
		"a worker in maintenance": {
			template: "maintenance",
			data:     liveData{Maintenance: []maintenanceRow{{Node: "node-4", Reason: "reboot", By: "admin/ops", Until: until}}},
			want:     []string{`data-node="node-4" data-voter="false"`, "In maintenance:</strong> node-4"},
			not:      []string{"A voter", "leadership"},
		},
		"no maintenance": {
			template: "maintenance", data: liveData{},
			want: []string{`<div id="maintenance">`},
			not:  []string{"maintenance-node"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			html, err := p.render(tc.template, tc.data)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(html, w) {
					t.Errorf("no %q in\n%s", w, html)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(html, n) {
					t.Errorf("%q in\n%s", n, html)
				}
			}
		})
	}
}
