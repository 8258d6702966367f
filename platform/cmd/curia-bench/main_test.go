package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// sampleOutput is go test -bench output of two packages, the curator's
// benchmark run three times (-count 3).
const sampleOutput = `goos: linux
goarch: amd64
pkg: curia.dev/services/consensus
cpu: AMD EPYC 7B13
BenchmarkJoinToVoter-2        	       3	3212345678 ns/op
PASS
ok  	curia.dev/services/consensus	40.1s
goos: linux
goarch: amd64
pkg: curia.dev/services/curator
cpu: AMD EPYC 7B13
BenchmarkGetNodes10k-2       	       1	 199425728 ns/op	     50149 nodes/s
BenchmarkGetNodes10k-2       	       1	 189425728 ns/op	     52149 nodes/s
BenchmarkGetNodes10k-2       	       1	 209425728 ns/op	     48149 nodes/s
BenchmarkRoleUpdates-2       	       1	2174258723 ns/op	       233.2 curator-updates/s	       871.3 etcd-txns/s	         0.2677 ratio
PASS
ok  	curia.dev/services/curator	60.3s
`

var fakeEnv = env{
	now:         func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) },
	gitDescribe: func() string { return "v0.1.0-3-gabcdef0-dirty" },
	gitCommit:   func() string { return "abcdef0123456789abcdef0123456789abcdef01" },
	numCPU:      func() int { return 2 },
}

func TestParse(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		want     []sample
		failures int
		copied   string // lines copied through, joined by \n
	}{
		{
			name: "GOMAXPROCS suffix and custom metrics",
			in:   "pkg: p\nBenchmarkRoleUpdates-2 \t 1\t2174258723 ns/op\t 233.2 curator-updates/s\t 0.2677 ratio\n",
			want: []sample{
				{"p", "BenchmarkRoleUpdates", 2, "ns/op", 2174258723},
				{"p", "BenchmarkRoleUpdates", 2, "curator-updates/s", 233.2},
				{"p", "BenchmarkRoleUpdates", 2, "ratio", 0.2677},
			},
			copied: "pkg: p",
		},
		{
			name: "no suffix at GOMAXPROCS 1",
			in:   "BenchmarkJoinToVoter \t 3\t 3212345678 ns/op\n",
			want: []sample{{"", "BenchmarkJoinToVoter", 1, "ns/op", 3212345678}},
		},
		{
			name: "-count repeats are separate samples",
			in:   "BenchmarkA-8 1 10 ns/op\nBenchmarkA-8 1 30 ns/op\nBenchmarkA-8 1 20 ns/op\n",
			want: []sample{
				{"", "BenchmarkA", 8, "ns/op", 10},
				{"", "BenchmarkA", 8, "ns/op", 30},
				{"", "BenchmarkA", 8, "ns/op", 20},
			},
		},
		{
			name: "sub-benchmark and -benchmem",
			in:   "BenchmarkWatch/streams=1000-2 \t 5\t 100 ns/op\t 64 B/op\t 2 allocs/op\n",
			want: []sample{
				{"", "BenchmarkWatch/streams=1000", 2, "ns/op", 100},
				{"", "BenchmarkWatch/streams=1000", 2, "B/op", 64},
				{"", "BenchmarkWatch/streams=1000", 2, "allocs/op", 2},
			},
		},
		{
			name: "result split by output printed while the benchmark ran",
			in:   "BenchmarkDrift-2   \tstarting etcd\nlog line\n       1\t 5 ns/op\t 120 ms/noticed\n",
			want: []sample{
				{"", "BenchmarkDrift", 2, "ns/op", 5},
				{"", "BenchmarkDrift", 2, "ms/noticed", 120},
			},
			copied: "starting etcd\nlog line",
		},
		{
			name:   "non-benchmark lines pass through, headers and PASS do not",
			in:     "goos: linux\ngoarch: amd64\ncpu: X\nPASS\nok  \tp\t1.0s\n--- BENCH: BenchmarkA-2\n    a_test.go:1: hello\n",
			copied: "ok  \tp\t1.0s\n--- BENCH: BenchmarkA-2\n    a_test.go:1: hello",
		},
		{
			name:     "FAIL lines",
			in:       "BenchmarkA-2 1 10 ns/op\n--- FAIL: BenchmarkB-2\n    b_test.go:3: boom\nFAIL\nFAIL\tcuria.dev/p\t1.2s\nFAILED is no FAIL line\n",
			want:     []sample{{"", "BenchmarkA", 2, "ns/op", 10}},
			failures: 3,
			copied:   "--- FAIL: BenchmarkB-2\n    b_test.go:3: boom\nFAIL\nFAIL\tcuria.dev/p\t1.2s\nFAILED is no FAIL line",
		},
		{
			name:   "a line that only looks like a result",
			in:     "BenchmarkA-2 1 10 ns/op 20\nBenchmarkB-2 x 10 ns/op\n",
			copied: "1 10 ns/op 20\nx 10 ns/op",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pass bytes.Buffer
			p, err := parse(strings.NewReader(tt.in), &pass)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p.samples, tt.want) {
				t.Errorf("samples\n got %v\nwant %v", p.samples, tt.want)
			}
			if len(p.failures) != tt.failures {
				t.Errorf("failures = %q, want %d", p.failures, tt.failures)
			}
			if got := strings.TrimSuffix(pass.String(), "\n"); got != tt.copied {
				t.Errorf("passed through\n got %q\nwant %q", got, tt.copied)
			}
		})
	}
}

func TestParseHeaders(t *testing.T) {
	p, err := parse(strings.NewReader(sampleOutput), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if p.cpu != "AMD EPYC 7B13" || p.goos != "linux" || p.goarch != "amd64" || p.procs() != 2 {
		t.Errorf("cpu %q goos %q goarch %q procs %d", p.cpu, p.goos, p.goarch, p.procs())
	}
	if got := p.samples[0].pkg; got != "curia.dev/services/consensus" {
		t.Errorf("first sample's package = %q", got)
	}
	if got := p.samples[len(p.samples)-1].pkg; got != "curia.dev/services/curator" {
		t.Errorf("last sample's package = %q", got)
	}
}

func TestSplitProcs(t *testing.T) {
	tests := []struct {
		in    string
		name  string
		procs int
	}{
		{"BenchmarkGetNodes10k-2", "BenchmarkGetNodes10k", 2},
		{"BenchmarkGetNodes10k", "BenchmarkGetNodes10k", 1},
		{"BenchmarkWatch/streams=1000-16", "BenchmarkWatch/streams=1000", 16},
		{"BenchmarkA/case-x-4", "BenchmarkA/case-x", 4},
		{"BenchmarkA/case-x", "BenchmarkA/case-x", 1},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			name, procs := splitProcs(tt.in)
			if name != tt.name || procs != tt.procs {
				t.Errorf("splitProcs(%q) = %q, %d; want %q, %d", tt.in, name, procs, tt.name, tt.procs)
			}
		})
	}
}

func TestDirection(t *testing.T) {
	tests := []struct {
		metric string
		want   Better
	}{
		{"ns/op", Lower},
		{"ms/delivery-to-all", Lower},
		{"ms/noticed", Lower},
		{"s/join", Lower},
		{"MB-rss", Lower},
		{"B/op", Lower},
		{"allocs/op", Lower},
		{"nodes/s", Higher},
		{"curator-updates/s", Higher},
		{"MB/s", Higher},
		{"ratio", Higher},
		{"etcd-txns/s", Higher},
		{"etcd-writes/s", Lower},
		{"raft-entries/s", Lower},
		{"etcd-writes/node/min", Lower},
		{"%cpu-leader", Lower},
		{"something-new", Lower},
	}
	for _, tt := range tests {
		t.Run(tt.metric, func(t *testing.T) {
			if got := direction(tt.metric); got != tt.want {
				t.Errorf("direction(%q) = %s, want %s", tt.metric, got, tt.want)
			}
		})
	}
}

func TestBetterOfTableWins(t *testing.T) {
	targets := targetIndex([]Target{
		{Benchmark: "BenchmarkX", Metric: "retries/s", Value: 1, Better: Lower},
		{Benchmark: "BenchmarkX", Metric: "ms/headroom", Value: 5, Better: Higher},
	})
	tests := []struct {
		bench, metric string
		want          Better
	}{
		{"BenchmarkX", "retries/s", Lower},
		{"BenchmarkX", "ms/headroom", Higher},
		{"BenchmarkY", "retries/s", Higher}, // no entry: the unit decides
		{"BenchmarkX", "ns/op", Lower},
	}
	for _, tt := range tests {
		t.Run(tt.bench+" "+tt.metric, func(t *testing.T) {
			if got := betterOf(tt.bench, tt.metric, targets); got != tt.want {
				t.Errorf("betterOf = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestKnownTargets(t *testing.T) {
	seen := map[targetKey]bool{}
	for _, tg := range knownTargets {
		k := targetKey{tg.Benchmark, tg.Metric}
		if seen[k] {
			t.Errorf("%v listed twice", k)
		}
		seen[k] = true
		if !strings.HasPrefix(tg.Benchmark, "Benchmark") || tg.Value <= 0 || tg.Source == "" {
			t.Errorf("incomplete entry %+v", tg)
		}
		if tg.Better != Lower && tg.Better != Higher {
			t.Errorf("%v: better %q", k, tg.Better)
		}
	}
}

func TestUnitOf(t *testing.T) {
	tests := []struct{ metric, want string }{
		{"ns/op", "ns"},
		{"ms/delivery-to-all", "ms"},
		{"MB-rss", "MB"},
		{"MB-rss-idle", "MB"},
		{"nodes/s", "/s"},
		{"ratio", ""},
		{"allocs/op", "allocs"},
		{"etcd-txns", "etcd-txns"},
	}
	for _, tt := range tests {
		t.Run(tt.metric, func(t *testing.T) {
			if got := unitOf(tt.metric); got != tt.want {
				t.Errorf("unitOf(%q) = %q, want %q", tt.metric, got, tt.want)
			}
		})
	}
}

func TestAggregate(t *testing.T) {
	samples := []sample{
		{"p", "BenchmarkB", 2, "ns/op", 30},
		{"p", "BenchmarkB", 2, "x/s", 1},
		{"p", "BenchmarkA", 2, "ns/op", 5},
		{"p", "BenchmarkB", 2, "ns/op", 10},
		{"p", "BenchmarkB", 2, "x/s", 3},
		{"p", "BenchmarkB", 2, "ns/op", 20},
		{"p", "BenchmarkB", 2, "ns/op", 100},
	}
	targets := targetIndex([]Target{{Benchmark: "BenchmarkB", Metric: "ns/op", Value: 25, Better: Lower, Source: "here"}})
	got := aggregate(samples, targets)
	target := 25.0
	want := []Result{
		{Benchmark: "BenchmarkB", Package: "p", Procs: 2, Metric: "ns/op", Unit: "ns", Value: 25, Min: 10, Max: 100, Runs: 4, Target: &target, Better: Lower, Source: "here"},
		{Benchmark: "BenchmarkB", Package: "p", Procs: 2, Metric: "x/s", Unit: "/s", Value: 2, Min: 1, Max: 3, Runs: 2, Better: Higher},
		{Benchmark: "BenchmarkA", Package: "p", Procs: 2, Metric: "ns/op", Unit: "ns", Value: 5, Min: 5, Max: 5, Runs: 1, Better: Lower},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("aggregate\n got %+v\nwant %+v", got, want)
	}
}

func TestMedian(t *testing.T) {
	tests := []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
	}
	for _, tt := range tests {
		if got := median(tt.in); got != tt.want {
			t.Errorf("median(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median(nil) is not NaN")
	}
}

func TestRatio(t *testing.T) {
	tests := []struct {
		name          string
		value, target float64
		better        Better
		want          float64
		ok            bool
	}{
		{"higher, met", 0.84, 0.7, Higher, 1.2, true},
		{"higher, missed", 0.2677, 0.7, Higher, 0.2677 / 0.7, true},
		{"lower, met", 25e6, 50e6, Lower, 2, true},
		{"lower, missed", 199425728, 50e6, Lower, 50e6 / 199425728, true},
		{"lower, zero value", 0, 50, Lower, 0, false},
		{"lower, below zero", -95.91, 500, Lower, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ratio(tt.value, tt.target, tt.better)
			if ok != tt.ok || math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("ratio = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
			// Met exactly when the ratio, where there is one, is ≥ 1;
			// a value at or below zero meets a lower-is-better target.
			if want := !ok && tt.better == Lower || ok && got >= 1; meets(tt.value, tt.target, tt.better) != want {
				t.Errorf("meets = %v, want %v", !want, want)
			}
		})
	}
}

func TestScaleAndNum(t *testing.T) {
	tests := []struct {
		metric string
		v      float64
		want   string // label value unit
	}{
		{"ns/op", 199425728, "time/op 199.4 ms"},
		{"ns/op", 2174258723, "time/op 2.174 s"},
		{"ns/op", 51234, "time/op 51.23 µs"},
		{"ns/op", 12, "time/op 12.00 ns"},
		{"nodes/s", 50149, "nodes/s 50149 /s"},
		{"ratio", 0.2677, "ratio 0.2677 "},
		{"MB-rss", 71.7, "MB-rss 71.70 MB"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			label, unit, f := scale(tt.metric, unitOf(tt.metric), tt.v)
			if got := label + " " + num(tt.v*f) + " " + unit; got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
	for v, want := range map[float64]string{50: "50", 0.7: "0.7", 5: "5", 0.05: "0.05", 1234.5678: "1235"} {
		if got := short(v); got != want {
			t.Errorf("short(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestJSONRoundTrip(t *testing.T) {
	p, err := parse(strings.NewReader(sampleOutput), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	rep := &Report{
		Meta: Meta{
			Time: "2026-01-02T03:04:05Z", Started: "2026-01-02T03:00:00Z", GoVersion: "go1.26.8", Git: "abc-dirty",
			Commit: "abcdef0123456789abcdef0123456789abcdef01", GOMAXPROCS: 2, NumCPU: 4, CPU: p.cpu, GOOS: "linux", GOARCH: "amd64",
			Benchtime: "3x", Count: 5, Scale: "n=1k", ScaleBenchtime: "1x", Failed: true,
		},
		Results: aggregate(p.samples, targetIndex(knownTargets)),
	}
	path := filepath.Join(t.TempDir(), "results.json")
	if err := writeReport(path, rep); err != nil {
		t.Fatal(err)
	}
	got, err := readReport(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rep) {
		t.Errorf("round trip\n got %+v\nwant %+v", got, rep)
	}
	// The field names others read.
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{`"benchmark"`, `"metric"`, `"unit"`, `"value"`, `"min"`, `"max"`, `"runs"`, `"target"`, `"better"`, `"time"`, `"go_version"`, `"git"`, `"gomaxprocs"`, `"cpu"`, `"results"`,
		`"started"`, `"commit"`, `"num_cpu"`, `"goos"`, `"goarch"`, `"benchtime"`, `"count"`, `"scale"`, `"scale_benchtime"`} {
		if !bytes.Contains(raw, []byte(field)) {
			t.Errorf("JSON lacks %s", field)
		}
	}
}

// A report written before the run's machine and knobs were recorded still
// reads, with those fields empty.
func TestReadOldReport(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "old.json")
	old := `{"time":"2026-12-03T10:00:00Z","go_version":"go1.26.8","git":"9d9b26a","gomaxprocs":2,"cpu":"AMD EPYC 7B13","goos":"linux","goarch":"amd64",
"results":[{"benchmark":"BenchmarkGetNodes10k","procs":2,"metric":"ns/op","unit":"ns","value":41000000,"min":41000000,"max":41000000,"runs":1,"target":50000000,"better":"lower"}]}`
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := readReport(path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Git != "9d9b26a" || rep.Commit != "" || rep.NumCPU != 0 || rep.Benchtime != "" || len(rep.Results) != 1 {
		t.Errorf("old report read as %+v", rep)
	}
}

func TestChange(t *testing.T) {
	tests := []struct {
		name     string
		old, new float64
		better   Better
		pct      float64
		verdict  string
	}{
		{"lower got lower", 200, 150, Lower, -25, "better"},
		{"lower got higher", 200, 250, Lower, 25, "worse"},
		{"higher got higher", 0.25, 0.5, Higher, 100, "better"},
		{"higher got lower", 100, 50, Higher, -50, "worse"},
		{"within threshold", 100, 101, Lower, 1, "same"},
		{"from zero, up, higher", 0, 3, Higher, math.NaN(), "better"},
		{"from zero, up, lower", 0, 3, Lower, math.NaN(), "worse"},
		{"zero both", 0, 0, Lower, 0, "same"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pct, verdict := change(tt.old, tt.new, tt.better, 2)
			samePct := pct == tt.pct || (math.IsNaN(pct) && math.IsNaN(tt.pct)) || math.Abs(pct-tt.pct) < 1e-9
			if !samePct || verdict != tt.verdict {
				t.Errorf("change = %v %s, want %v %s", pct, verdict, tt.pct, tt.verdict)
			}
		})
	}
}

func TestCompare(t *testing.T) {
	res := func(name, metric string, v, lo, hi float64, runs int) Result {
		return Result{Benchmark: name, Package: "p", Procs: 2, Metric: metric, Unit: unitOf(metric), Value: v, Min: lo, Max: hi, Runs: runs, Better: direction(metric)}
	}
	old := &Report{Results: []Result{
		res("BenchmarkA", "ns/op", 200e6, 200e6, 200e6, 1),
		res("BenchmarkA", "nodes/s", 1000, 900, 1100, 3),
		res("BenchmarkGone", "ns/op", 1, 1, 1, 1),
	}}
	cur := &Report{Results: []Result{
		res("BenchmarkA", "ns/op", 100e6, 100e6, 100e6, 1),
		res("BenchmarkA", "nodes/s", 950, 920, 1050, 3),
		res("BenchmarkNew", "ratio", 0.5, 0.5, 0.5, 1),
	}}
	got := compare(old, cur, 2)
	type row struct {
		bench, metric, verdict string
		overlap                bool
	}
	var rows []row
	for _, c := range got {
		rows = append(rows, row{c.Benchmark, c.Metric, c.Verdict, c.Overlap})
	}
	want := []row{
		{"BenchmarkA", "ns/op", "better", false},
		{"BenchmarkA", "nodes/s", "worse", true},
		{"BenchmarkNew", "ratio", "new", false},
		{"BenchmarkGone", "ns/op", "gone", false},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("compare\n got %+v\nwant %+v", rows, want)
	}
	if math.Abs(got[0].Percent-(-50)) > 1e-9 {
		t.Errorf("ns/op change = %v%%, want -50%%", got[0].Percent)
	}
}

func TestRunReport(t *testing.T) {
	tests := []struct {
		name        string
		in          string
		targets     string // a -targets file's content, if any
		status      int
		wantOut     []string
		wantResults int
	}{
		{
			name:   "pass",
			in:     sampleOutput,
			status: 0,
			wantOut: []string{
				"git v0.1.0-3-gabcdef0-dirty", "GOMAXPROCS 2", "cpu: AMD EPYC 7B13",
				"BenchmarkGetNodes10k", "199.4", "ms", "≤ 50", "0.25", "missed", "189.4–209.4",
				"≥ 0.7", "0.38", "BenchmarkJoinToVoter", "3.212", "≤ 5", "met",
				"targets without a result: BenchmarkWatchFanout/watchers=1000 ms/delivery-p99",
			},
			wantResults: 7,
		},
		{
			name:        "FAIL after a result",
			in:          "pkg: p\nBenchmarkA-2 1 10 ns/op\n--- FAIL: BenchmarkB-2\nFAIL\tp\t1s\n",
			status:      1,
			wantOut:     []string{"BenchmarkA", "FAILED"},
			wantResults: 1,
		},
		{
			name:    "no benchmarks",
			in:      "ok  \tp\t0.01s [no tests to run]\n",
			status:  1,
			wantOut: []string{"(no benchmark results)"},
		},
		{
			name:        "a targets file adds and replaces",
			in:          "BenchmarkA-2 1 10 ns/op 7 widgets/s\nBenchmarkGetNodes10k-2 1 40000000 ns/op\n",
			targets:     `[{"benchmark":"BenchmarkA","metric":"widgets/s","target":14,"source":"peer: widgetd"},{"benchmark":"BenchmarkGetNodes10k","metric":"ns/op","target":20e6,"better":"lower","source":"stricter"}]`,
			status:      0,
			wantOut:     []string{"≥ 14", "0.50", "peer: widgetd", "≤ 20", "stricter"},
			wantResults: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "results.json")
			args := []string{"report", "-json", path, "-benchtime", "1x", "-count", "3", "-scale", "none", "-scale-benchtime", "2x"}
			if tt.targets != "" {
				tf := filepath.Join(dir, "targets.json")
				if err := os.WriteFile(tf, []byte(tt.targets), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "-targets", tf)
			}
			var stdout, stderr bytes.Buffer
			if got := run(args, strings.NewReader(tt.in), &stdout, &stderr, fakeEnv); got != tt.status {
				t.Errorf("status %d, want %d; stderr:\n%s", got, tt.status, stderr.String())
			}
			for _, s := range tt.wantOut {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("output lacks %q:\n%s", s, stdout.String())
				}
			}
			rep, err := readReport(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Results) != tt.wantResults || rep.Time != "2026-01-02T03:04:05Z" || rep.Git != "v0.1.0-3-gabcdef0-dirty" {
				t.Errorf("JSON: %d results (want %d), time %q, git %q", len(rep.Results), tt.wantResults, rep.Time, rep.Git)
			}
			wantMeta := Meta{
				Time: "2026-01-02T03:04:05Z", Started: "2026-01-02T03:04:05Z",
				Git: "v0.1.0-3-gabcdef0-dirty", Commit: "abcdef0123456789abcdef0123456789abcdef01",
				NumCPU: 2, Benchtime: "1x", Count: 3, Scale: "none", ScaleBenchtime: "2x",
			}
			gotMeta := Meta{
				Time: rep.Time, Started: rep.Started, Git: rep.Git, Commit: rep.Commit,
				NumCPU: rep.NumCPU, Benchtime: rep.Benchtime, Count: rep.Count, Scale: rep.Scale, ScaleBenchtime: rep.ScaleBenchtime,
			}
			if gotMeta != wantMeta {
				t.Errorf("JSON meta\n got %+v\nwant %+v", gotMeta, wantMeta)
			}
			if rep.Failed != (tt.status != 0 && tt.wantResults > 0) {
				t.Errorf("JSON failed = %v", rep.Failed)
			}
		})
	}
}

func TestRunUsage(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`[{"benchmark":"BenchmarkA","metric":"x","target":1,"better":"up"}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
	}{
		{"no command", nil},
		{"unknown command", []string{"plot"}},
		{"report with arguments", []string{"report", "extra"}},
		{"bad targets file", []string{"report", "-targets", bad}},
		{"compare one file", []string{"compare", "a.json"}},
		{"compare missing files", []string{"compare", filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if got := run(tt.args, strings.NewReader(""), &stdout, &stderr, fakeEnv); got != 2 {
				t.Errorf("status %d, want 2; stderr: %s", got, stderr.String())
			}
		})
	}
}

func TestRunCompare(t *testing.T) {
	dir := t.TempDir()
	report := func(name, in string) string {
		path := filepath.Join(dir, name)
		var stdout, stderr bytes.Buffer
		if got := run([]string{"report", "-json", path}, strings.NewReader(in), &stdout, &stderr, fakeEnv); got != 0 {
			t.Fatalf("report %s: status %d: %s", name, got, stderr.String())
		}
		return path
	}
	old := report("old.json", sampleOutput)
	faster := strings.NewReplacer("3212345678 ns/op", "2212345678 ns/op", "233.2 curator-updates/s", "150.0 curator-updates/s").Replace(sampleOutput)
	cur := report("new.json", faster)

	var stdout, stderr bytes.Buffer
	if got := run([]string{"compare", old, cur}, nil, &stdout, &stderr, fakeEnv); got != 0 {
		t.Fatalf("compare: status %d: %s", got, stderr.String())
	}
	out := stdout.String()
	for _, s := range []string{"-31.1%", "better", "-35.7%", "worse", "+0.0%", "same", "1 better, 1 worse"} {
		if !strings.Contains(out, s) {
			t.Errorf("compare output lacks %q:\n%s", s, out)
		}
	}
	lines := strings.Split(out, "\n")
	for _, l := range lines {
		if strings.Contains(l, "curator-updates/s") && !strings.HasSuffix(l, "worse") {
			t.Errorf("curator-updates/s fell and is not worse: %q", l)
		}
		if strings.Contains(l, "BenchmarkJoinToVoter") && !strings.HasSuffix(l, "better") {
			t.Errorf("JoinToVoter got faster and is not better: %q", l)
		}
	}
}
