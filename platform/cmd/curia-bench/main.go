// Command curia-bench turns the output of `go test -bench` into one table
// of every benchmark's metrics against the project's targets, and into a
// JSON file that a later run can be compared with. `make bench` and `make
// bench-compare` run it.
//
//	go test -run '^$' -bench . ./services/curator/ | curia-bench report -json bench/results.json
//	curia-bench compare bench/old.json bench/results.json
//	curia-bench doc -update docs/operating/benchmarks.md bench/results.json
//
// report reads any benchmark line (ns/op and every b.ReportMetric unit);
// repeated runs of one benchmark (-count) become the median with min and
// max. A metric's target comes from knownTargets (targets.go); which way is
// better comes from that table or, for metrics without an entry, from the
// unit: rates (…/s) and ratio are higher-is-better, except the load a
// workload puts on etcd (…writes/s, …entries/s), everything else (ns/op,
// ms/…, s/…, MB-…, B/op, allocs/op) is a cost, lower-is-better. report
// exits 1 when the input holds a FAIL (after printing and writing what it
// has) or no benchmark at all.
//
// doc renders a report as markdown: a line saying which run it is (when,
// with which knobs, of which commit, on what machine), a table of the
// metrics with a target and one of every other metric. With -update it
// rewrites the part of a page between <!-- bench:begin --> and
// <!-- bench:end --> (`make bench-doc`: docs/operating/benchmarks.md from
// the committed bench/results.json); a test fails when that part is not
// what doc renders.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Better says which way a metric improves.
type Better string

const (
	Lower  Better = "lower"
	Higher Better = "higher"
)

// Target is what one metric of one benchmark should reach (knownTargets).
type Target struct {
	Benchmark string  `json:"benchmark"`
	Metric    string  `json:"metric"`
	Value     float64 `json:"target"`
	Better    Better  `json:"better"`
	Source    string  `json:"source"`
}

// Result is one metric of one benchmark, over all its runs.
type Result struct {
	Benchmark string `json:"benchmark"`
	Package   string `json:"package,omitempty"`
	// Procs is the -N suffix of the benchmark's name: its GOMAXPROCS.
	Procs int `json:"procs"`
	// Metric is the unit string as go test printed it: ns/op, nodes/s,
	// ms/delivery-to-all, MB-rss, ratio.
	Metric string `json:"metric"`
	// Unit is the unit of Value, Min, Max and Target: ns for ns/op, ms for
	// ms/delivery-to-all, MB for MB-rss, /s for rates, empty for ratio.
	Unit string `json:"unit"`
	// Value is the median over the runs.
	Value  float64  `json:"value"`
	Min    float64  `json:"min"`
	Max    float64  `json:"max"`
	Runs   int      `json:"runs"`
	Target *float64 `json:"target"`
	Better Better   `json:"better"`
	// Source says where the target comes from.
	Source string `json:"target_source,omitempty"`
}

// Meta describes the run a report comes from: when, on what machine, of
// which commit and with which knobs. Fields added later are omitempty, so
// reports written before them still read (as empty).
type Meta struct {
	// Time is when the report was written, at the end of the run; Started
	// when curia-bench started reading go test's output, with the run.
	Time    string `json:"time"`
	Started string `json:"started,omitempty"`
	// GoVersion is the Go that built curia-bench: `make bench` runs it with
	// the go command that runs the benchmarks.
	GoVersion string `json:"go_version"`
	// Git is git describe --always --dirty, Commit git rev-parse HEAD, both
	// taken as the run started.
	Git        string `json:"git"`
	Commit     string `json:"commit,omitempty"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	// NumCPU is the machine's logical CPUs (runtime.NumCPU).
	NumCPU int    `json:"num_cpu,omitempty"`
	CPU    string `json:"cpu,omitempty"`
	GOOS   string `json:"goos,omitempty"`
	GOARCH string `json:"goarch,omitempty"`
	// Benchtime and Count are go test's -benchtime and -count; Scale and
	// ScaleBenchtime `make bench`'s SCALE (which sub-benchmarks of the scale
	// benchmarks ran: none for none) and SCALE_BENCHTIME. curia-bench
	// cannot see them in go test's output: make bench passes them.
	Benchtime      string `json:"benchtime,omitempty"`
	Count          int    `json:"count,omitempty"`
	Scale          string `json:"scale,omitempty"`
	ScaleBenchtime string `json:"scale_benchtime,omitempty"`
	// Failed marks a run whose go test output held a FAIL: its results
	// are what ran before (and around) the failure.
	Failed bool `json:"failed,omitempty"`
}

// Report is the JSON file: the run's metadata and its results.
type Report struct {
	Meta
	Results []Result `json:"results"`
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, realEnv))
}

// env is what a report takes from outside its input.
type env struct {
	now         func() time.Time
	gitDescribe func() string
	gitCommit   func() string
	numCPU      func() int
}

var realEnv = env{
	now:         time.Now,
	gitDescribe: func() string { return git("describe", "--always", "--dirty") },
	gitCommit:   func() string { return git("rev-parse", "HEAD") },
	numCPU:      runtime.NumCPU,
}

// git runs git with args and returns its output, or unknown.
func git(args ...string) string {
	out, err := exec.Command("git", args...).Output() //nolint:gosec // G204: git with fixed arguments (describe, rev-parse HEAD) from this file
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

const usage = `usage:
  curia-bench report -json FILE [-targets FILE] < go-test-bench-output
  curia-bench compare [-threshold PERCENT] OLD.json NEW.json
  curia-bench doc [-update PAGE.md] RESULTS.json
`

func run(args []string, stdin io.Reader, stdout, stderr io.Writer, e env) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "report":
		return runReport(args[1:], stdin, stdout, stderr, e)
	case "compare":
		return runCompare(args[1:], stdout, stderr)
	case "doc":
		return runDoc(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "curia-bench: unknown command %q\n%s", args[0], usage)
		return 2
	}
}

func runReport(args []string, stdin io.Reader, stdout, stderr io.Writer, e env) int {
	fs := flag.NewFlagSet("curia-bench report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonPath := fs.String("json", "", "write the results as JSON to this file")
	targetsPath := fs.String("targets", "", "JSON list of {benchmark, metric, target, better, source} that add to or replace the built-in targets")
	var knobs Meta
	fs.StringVar(&knobs.Benchtime, "benchtime", "", "go test's -benchtime, to record in the report")
	fs.IntVar(&knobs.Count, "count", 0, "go test's -count, to record in the report")
	fs.StringVar(&knobs.Scale, "scale", "", "make bench's SCALE, to record in the report")
	fs.StringVar(&knobs.ScaleBenchtime, "scale-benchtime", "", "make bench's SCALE_BENCHTIME, to record in the report")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "curia-bench report: unexpected arguments %q (go test output comes on stdin)\n", fs.Args())
		return 2
	}
	targets := targetIndex(knownTargets)
	if *targetsPath != "" {
		extra, err := readTargets(*targetsPath)
		if err != nil {
			fmt.Fprintln(stderr, "curia-bench report:", err)
			return 2
		}
		for _, t := range extra {
			targets[targetKey{t.Benchmark, t.Metric}] = t
		}
	}

	// What the run starts from: the tree may change while it runs.
	started := e.now().UTC().Format(time.RFC3339)
	gitDescribe, gitCommit := e.gitDescribe(), e.gitCommit()
	p, err := parse(stdin, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "curia-bench report: reading go test output:", err)
		return 1
	}
	rep := &Report{
		Meta: Meta{
			Time:           e.now().UTC().Format(time.RFC3339),
			Started:        started,
			GoVersion:      runtime.Version(),
			Git:            gitDescribe,
			Commit:         gitCommit,
			GOMAXPROCS:     p.procs(),
			NumCPU:         e.numCPU(),
			CPU:            p.cpu,
			GOOS:           p.goos,
			GOARCH:         p.goarch,
			Benchtime:      knobs.Benchtime,
			Count:          knobs.Count,
			Scale:          knobs.Scale,
			ScaleBenchtime: knobs.ScaleBenchtime,
			Failed:         len(p.failures) > 0,
		},
		Results: aggregate(p.samples, targets),
	}
	printReport(stdout, rep, targets)

	status := 0
	if *jsonPath != "" {
		if err := writeReport(*jsonPath, rep); err != nil {
			fmt.Fprintln(stderr, "curia-bench report:", err)
			status = 1
		}
	}
	if len(p.failures) > 0 {
		fmt.Fprintf(stderr, "curia-bench report: go test failed (%d FAIL lines, first: %q); the table holds what ran\n", len(p.failures), p.failures[0])
		status = 1
	}
	if len(rep.Results) == 0 {
		fmt.Fprintln(stderr, "curia-bench report: no benchmark results in the input")
		status = 1
	}
	return status
}

// ---- parsing go test output ----

type sample struct {
	pkg, name string
	procs     int
	metric    string
	value     float64
}

type parsed struct {
	samples           []sample
	cpu, goos, goarch string
	failures          []string
	procsSeen         []int
}

// procs is the GOMAXPROCS the benchmarks ran with: the suffix of their
// names (go test adds none when it is 1). With several (-cpu 1,2), the first.
func (p *parsed) procs() int {
	if len(p.procsSeen) == 0 {
		return runtime.GOMAXPROCS(0)
	}
	return p.procsSeen[0]
}

// parse reads go test -bench output. Benchmark lines become samples; the
// goos/goarch/cpu/pkg headers are kept; every other line (logs, ok, FAIL)
// is copied to pass. A benchmark whose result line was split by output
// printed while it ran ("BenchmarkX-2  \t<log>" … "1\t123 ns/op") is
// joined again.
func parse(r io.Reader, pass io.Writer) (*parsed, error) {
	p := &parsed{}
	var pkg, pending string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if isFailure(trimmed) {
			p.failures = append(p.failures, trimmed)
		}
		if k, v, ok := header(trimmed); ok {
			switch k {
			case "pkg":
				pkg = v
				fmt.Fprintln(pass, line) // progress: which package runs now
			case "cpu":
				if p.cpu == "" {
					p.cpu = v
				}
			case "goos":
				p.goos = v
			case "goarch":
				p.goarch = v
			}
			continue
		}
		if trimmed == "PASS" {
			continue
		}
		name, pairs, ok := parseBenchLine(trimmed, pending)
		if !ok {
			if f := strings.Fields(trimmed); len(f) > 0 && strings.HasPrefix(f[0], "Benchmark") {
				// A benchmark's name, its result still to come.
				pending = f[0]
				if rest := strings.TrimSpace(strings.TrimPrefix(trimmed, f[0])); rest != "" {
					fmt.Fprintln(pass, rest)
				}
				continue
			}
			fmt.Fprintln(pass, line)
			continue
		}
		pending = ""
		base, procs := splitProcs(name)
		if !slices.Contains(p.procsSeen, procs) {
			p.procsSeen = append(p.procsSeen, procs)
		}
		for _, pr := range pairs {
			p.samples = append(p.samples, sample{pkg: pkg, name: base, procs: procs, metric: pr.metric, value: pr.value})
		}
	}
	return p, sc.Err()
}

// isFailure is a FAIL line of go test: "FAIL", "FAIL\tpkg 1.2s",
// "--- FAIL: BenchmarkX".
func isFailure(trimmed string) bool {
	return trimmed == "FAIL" || strings.HasPrefix(trimmed, "FAIL\t") || strings.HasPrefix(trimmed, "FAIL ") ||
		strings.HasPrefix(trimmed, "--- FAIL")
}

// header splits a go test header line ("cpu: …").
func header(trimmed string) (key, value string, ok bool) {
	for _, k := range []string{"goos", "goarch", "pkg", "cpu"} {
		if v, found := strings.CutPrefix(trimmed, k+": "); found {
			return k, strings.TrimSpace(v), true
		}
	}
	return "", "", false
}

type pair struct {
	metric string
	value  float64
}

// parseBenchLine parses "BenchmarkX-2  1  199425728 ns/op  50149 nodes/s",
// or, with a pending name, the same line without it.
func parseBenchLine(trimmed, pending string) (name string, pairs []pair, ok bool) {
	f := strings.Fields(trimmed)
	if len(f) > 0 && strings.HasPrefix(f[0], "Benchmark") {
		name, f = f[0], f[1:]
	} else if pending != "" {
		name = pending
	} else {
		return "", nil, false
	}
	// Iterations, then value–unit pairs.
	if len(f) < 3 || len(f)%2 != 1 {
		return "", nil, false
	}
	if _, err := strconv.ParseUint(f[0], 10, 64); err != nil {
		return "", nil, false
	}
	for i := 1; i < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return "", nil, false
		}
		if _, err := strconv.ParseFloat(f[i+1], 64); err == nil {
			return "", nil, false // a number where a unit belongs
		}
		pairs = append(pairs, pair{metric: f[i+1], value: v})
	}
	return name, pairs, true
}

// splitProcs splits the -GOMAXPROCS suffix off a benchmark's name
// ("BenchmarkGetNodes10k-2" → "BenchmarkGetNodes10k", 2). go test adds it
// only when GOMAXPROCS is not 1.
func splitProcs(name string) (string, int) {
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		if n, err := strconv.Atoi(name[i+1:]); err == nil && n > 0 {
			return name[:i], n
		}
	}
	return name, 1
}

// ---- results ----

type targetKey struct{ benchmark, metric string }

func targetIndex(ts []Target) map[targetKey]Target {
	m := make(map[targetKey]Target, len(ts))
	for _, t := range ts {
		m[targetKey{t.Benchmark, t.Metric}] = t
	}
	return m
}

func readTargets(path string) ([]Target, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var ts []Target
	if err := json.Unmarshal(b, &ts); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, t := range ts {
		if t.Benchmark == "" || t.Metric == "" {
			return nil, fmt.Errorf("%s: entry %d: benchmark and metric are required", path, i)
		}
		switch t.Better {
		case Lower, Higher:
		case "":
			ts[i].Better = direction(t.Metric)
		default:
			return nil, fmt.Errorf("%s: entry %d: better is %q, want lower or higher", path, i, t.Better)
		}
	}
	return ts, nil
}

// direction is which way a metric without a table entry improves: rates
// (…/s, e.g. nodes/s, MB/s) and ratio are higher-is-better; everything
// else is a cost (ns/op, ms/…, s/…, MB-…, B/op, allocs/op). So are the
// rates a fixed workload loads etcd with (…writes/s, …entries/s: the
// scale benchmarks' etcd-writes/s and raft-entries/s), unlike what a
// benchmark gets done (etcd-txns/s, curator-updates/s).
func direction(metric string) Better {
	for _, load := range loadRates {
		if strings.HasSuffix(metric, load) {
			return Lower
		}
	}
	if strings.HasSuffix(metric, "/s") || metric == "ratio" {
		return Higher
	}
	return Lower
}

// loadRates end the names of rates that are costs (direction).
var loadRates = []string{"writes/s", "entries/s"}

// betterOf is the direction of a metric of a benchmark: its table entry's,
// else direction's.
func betterOf(benchmark, metric string, targets map[targetKey]Target) Better {
	if t, ok := targets[targetKey{benchmark, metric}]; ok {
		return t.Better
	}
	return direction(metric)
}

// sizeUnits may open a metric's name, before a '-' (MB-rss).
var sizeUnits = []string{"B", "KB", "MB", "GB", "KiB", "MiB", "GiB", "ns", "us", "µs", "ms", "s"}

// unitOf is the unit of a metric's values: what stands before its '/'
// (ns/op → ns, ms/delivery-to-all → ms, allocs/op → allocs), /s for a rate
// (nodes/s), a size or time before a '-' (MB-rss → MB), nothing for ratio,
// else the metric itself.
func unitOf(metric string) string {
	switch {
	case metric == "ratio":
		return ""
	case strings.HasSuffix(metric, "/s"):
		return "/s"
	}
	if before, _, ok := strings.Cut(metric, "/"); ok && before != "" {
		return before
	}
	if before, _, ok := strings.Cut(metric, "-"); ok && slices.Contains(sizeUnits, before) {
		return before
	}
	return metric
}

// aggregate folds the samples into one Result per benchmark and metric, in
// the order the benchmarks and their metrics first appeared.
func aggregate(samples []sample, targets map[targetKey]Target) []Result {
	type key struct {
		pkg, name string
		procs     int
		metric    string
	}
	var order []key
	values := map[key][]float64{}
	for _, s := range samples {
		k := key{s.pkg, s.name, s.procs, s.metric}
		if _, ok := values[k]; !ok {
			order = append(order, k)
		}
		values[k] = append(values[k], s.value)
	}
	// Group by benchmark, keeping first appearance.
	type bench struct {
		pkg, name string
		procs     int
	}
	var benches []bench
	for _, k := range order {
		if b := (bench{k.pkg, k.name, k.procs}); !slices.Contains(benches, b) {
			benches = append(benches, b)
		}
	}
	var out []Result
	for _, b := range benches {
		for _, k := range order {
			if (bench{k.pkg, k.name, k.procs}) != b {
				continue
			}
			vs := values[k]
			r := Result{
				Benchmark: k.name, Package: k.pkg, Procs: k.procs,
				Metric: k.metric, Unit: unitOf(k.metric),
				Value: median(vs), Min: slices.Min(vs), Max: slices.Max(vs), Runs: len(vs),
				Better: betterOf(k.name, k.metric, targets),
			}
			if t, ok := targets[targetKey{k.name, k.metric}]; ok {
				r.Target = &t.Value
				r.Source = t.Source
			}
			out = append(out, r)
		}
	}
	return out
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// ratio is how far value meets target: value ÷ target where higher is
// better, target ÷ value where lower is better; ≥ 1 meets it. There is
// none for a value of 0 or below where lower is better (a failover
// answered before the TTL ran out: -96 ms over it), which meets any
// positive target: meets says.
func ratio(value, target float64, b Better) (float64, bool) {
	num, den := value, target
	if b == Lower {
		num, den = target, value
	}
	if den <= 0 || math.IsNaN(num) || math.IsNaN(den) {
		return 0, false
	}
	return num / den, true
}

// meets says whether value meets target.
func meets(value, target float64, b Better) bool {
	if b == Lower {
		return value <= target
	}
	return value >= target
}

func writeReport(path string, rep *Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644) //nolint:gosec // G306: a report to read and share, no secret
}

func readReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &rep, nil
}

// ---- display ----

// scale is how a metric is shown: ns/op as time/op in µs, ms or s, chosen by
// the size of v; every other metric as it is.
func scale(metric, unit string, v float64) (label, shown string, factor float64) {
	if unit != "ns" {
		return metric, unit, 1
	}
	label = "time/" + strings.TrimPrefix(metric, "ns/")
	switch a := math.Abs(v); {
	case a >= 1e9:
		return label, "s", 1e-9
	case a >= 1e6:
		return label, "ms", 1e-6
	case a >= 1e3:
		return label, "µs", 1e-3
	}
	return label, "ns", 1
}

// num prints a value with about four significant digits and no exponent.
func num(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return fmt.Sprint(v)
	case a >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case a >= 1 || a == 0:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

func sign(b Better) string {
	if b == Higher {
		return "≥"
	}
	return "≤"
}

// displayName names benchmarks as go test does, with the -N suffix, only
// when the results hold more than one GOMAXPROCS.
func displayName(r Result, multiProcs bool) string {
	if multiProcs && r.Procs != 1 {
		return fmt.Sprintf("%s-%d", r.Benchmark, r.Procs)
	}
	return r.Benchmark
}

func multiProcs(rs ...[]Result) bool {
	seen := map[int]bool{}
	for _, list := range rs {
		for _, r := range list {
			seen[r.Procs] = true
		}
	}
	return len(seen) > 1
}

// table prints rows aligned; right[i] right-aligns column i. Columns that
// are empty in every row but the header are still printed.
type table struct {
	rows  [][]string
	right []bool
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) print(w io.Writer) {
	var width []int
	for _, row := range t.rows {
		for i, c := range row {
			if i >= len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, row := range t.rows {
		var b strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i > 0 {
				b.WriteString("  ")
			}
			if i < len(t.right) && t.right[i] {
				b.WriteString(pad + c)
			} else {
				b.WriteString(c + pad)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

func printReport(w io.Writer, rep *Report, targets map[targetKey]Target) {
	m := rep.Meta
	fmt.Fprintf(w, "\ncuria benchmarks · %s · git %s · %s %s/%s · GOMAXPROCS %d · %d CPUs\n", m.Time, m.Git, m.GoVersion, m.GOOS, m.GOARCH, m.GOMAXPROCS, m.NumCPU)
	if m.CPU != "" {
		fmt.Fprintf(w, "cpu: %s\n", m.CPU)
	}
	fmt.Fprintln(w)
	if len(rep.Results) == 0 {
		fmt.Fprintln(w, "(no benchmark results)")
		return
	}
	repeated := slices.ContainsFunc(rep.Results, func(r Result) bool { return r.Runs > 1 })
	multi := multiProcs(rep.Results)
	t := &table{right: []bool{false, false, true, false, true, true, false, true}}
	head := []string{"benchmark", "metric", "value", "unit", "target", "ratio", ""}
	if repeated {
		head = append(head, "min–max", "runs")
	}
	t.add(head...)
	prev := ""
	var notes []string
	for _, r := range rep.Results {
		name := displayName(r, multi)
		shownName := name
		if name == prev {
			shownName = ""
		}
		prev = name
		label, unit, f := scale(r.Metric, r.Unit, r.Value)
		target, rt, verdict := "", "", ""
		if r.Target != nil {
			target = sign(r.Better) + " " + short(*r.Target*f)
			if q, ok := ratio(r.Value, *r.Target, r.Better); ok {
				rt = fmt.Sprintf("%.2f", q)
			}
			verdict = "missed"
			if meets(r.Value, *r.Target, r.Better) {
				verdict = "met"
			}
			notes = append(notes, fmt.Sprintf("  %s %s: %s", name, label, r.Source))
		}
		row := []string{shownName, label, num(r.Value * f), unit, target, rt, verdict}
		if repeated {
			spread := ""
			if r.Runs > 1 {
				spread = num(r.Min*f) + "–" + num(r.Max*f)
			}
			row = append(row, spread, strconv.Itoa(r.Runs))
		}
		t.add(row...)
	}
	t.print(w)
	fmt.Fprintln(w)
	if repeated {
		fmt.Fprintln(w, "value: the median of the runs; min–max: over the runs.")
	}
	fmt.Fprintln(w, "ratio ≥ 1 meets the target: target ÷ value where lower is better (≤), value ÷ target where higher is better (≥).")
	if len(notes) > 0 {
		fmt.Fprintln(w, "targets:")
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
	}
	// Targets of benchmarks that did not run (or not yet exist).
	var missing []string
	for _, tg := range knownOrder(targets) {
		if !slices.ContainsFunc(rep.Results, func(r Result) bool { return r.Benchmark == tg.Benchmark && r.Metric == tg.Metric }) {
			missing = append(missing, tg.Benchmark+" "+tg.Metric)
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(w, "targets without a result: %s\n", strings.Join(missing, ", "))
	}
	if m.Failed {
		fmt.Fprintln(w, "go test FAILED: the results are incomplete.")
	}
}

// short prints a target: four significant digits at most, no trailing
// zeros (50, 0.7, 0.05).
func short(v float64) string {
	r, err := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 4, 64), 64)
	if err != nil {
		return num(v)
	}
	return strconv.FormatFloat(r, 'f', -1, 64)
}

// knownOrder lists targets in the order of knownTargets, then any others
// (from -targets) by name.
func knownOrder(targets map[targetKey]Target) []Target {
	var out []Target
	done := map[targetKey]bool{}
	for _, t := range knownTargets {
		k := targetKey{t.Benchmark, t.Metric}
		if tt, ok := targets[k]; ok && !done[k] {
			out = append(out, tt)
			done[k] = true
		}
	}
	var rest []Target
	for k, t := range targets {
		if !done[k] {
			rest = append(rest, t)
		}
	}
	slices.SortFunc(rest, func(a, b Target) int {
		return strings.Compare(a.Benchmark+" "+a.Metric, b.Benchmark+" "+b.Metric)
	})
	return append(out, rest...)
}

// ---- compare ----

func runCompare(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("curia-bench compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	threshold := fs.Float64("threshold", 2, "changes smaller than this many percent are shown as same")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 2 {
		fmt.Fprint(stderr, "curia-bench compare: want OLD.json NEW.json\n", usage)
		return 2
	}
	old, err := readReport(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "curia-bench compare:", err)
		return 2
	}
	cur, err := readReport(fs.Arg(1))
	if err != nil {
		fmt.Fprintln(stderr, "curia-bench compare:", err)
		return 2
	}
	printComparison(stdout, old, cur, compare(old, cur, *threshold), *threshold)
	return 0
}

// Change is one metric in both reports, or in one of them (Old or New nil).
type Change struct {
	Benchmark, Metric string
	Old, New          *Result
	// Percent is (new − old) ÷ old × 100; NaN when old is 0 or missing.
	Percent float64
	// Verdict is better, worse or same (|Percent| below the threshold),
	// new or gone. Overlap says both sides ran more than once and their
	// min–max ranges overlap: the change may be noise.
	Verdict string
	Overlap bool
}

func compare(old, cur *Report, threshold float64) []Change {
	multi := multiProcs(old.Results, cur.Results)
	type key struct{ pkg, name, metric string }
	keyOf := func(r Result) key { return key{r.Package, displayName(r, multi), r.Metric} }
	olds := map[key]*Result{}
	for i := range old.Results {
		olds[keyOf(old.Results[i])] = &old.Results[i]
	}
	var out []Change
	matched := map[key]bool{}
	for i := range cur.Results {
		n := &cur.Results[i]
		k := keyOf(*n)
		c := Change{Benchmark: k.name, Metric: n.Metric, New: n, Percent: math.NaN(), Verdict: "new"}
		if o, ok := olds[k]; ok {
			matched[k] = true
			c.Old = o
			c.Percent, c.Verdict = change(o.Value, n.Value, n.Better, threshold)
			c.Overlap = o.Runs > 1 && n.Runs > 1 && o.Min <= n.Max && n.Min <= o.Max
		}
		out = append(out, c)
	}
	for i := range old.Results {
		o := &old.Results[i]
		if k := keyOf(*o); !matched[k] {
			out = append(out, Change{Benchmark: k.name, Metric: o.Metric, Old: o, Percent: math.NaN(), Verdict: "gone"})
		}
	}
	return out
}

// change is the change from old to new in percent and whether it is better,
// worse or the same (within threshold percent) for a metric improving the
// way b says.
func change(old, cur float64, b Better, threshold float64) (float64, string) {
	if old == 0 {
		if cur == 0 {
			return 0, "same"
		}
		up := cur > 0
		if up == (b == Higher) {
			return math.NaN(), "better"
		}
		return math.NaN(), "worse"
	}
	p := (cur - old) / math.Abs(old) * 100
	switch {
	case math.Abs(p) < threshold:
		return p, "same"
	case (p > 0) == (b == Higher):
		return p, "better"
	}
	return p, "worse"
}

func printComparison(w io.Writer, old, cur *Report, changes []Change, threshold float64) {
	fmt.Fprintf(w, "\nold: %s · git %s · %s · GOMAXPROCS %d\n", old.Time, old.Git, old.GoVersion, old.GOMAXPROCS)
	fmt.Fprintf(w, "new: %s · git %s · %s · GOMAXPROCS %d\n", cur.Time, cur.Git, cur.GoVersion, cur.GOMAXPROCS)
	if old.CPU != cur.CPU || old.GOMAXPROCS != cur.GOMAXPROCS {
		fmt.Fprintf(w, "warning: different machines (cpu %q vs %q, GOMAXPROCS %d vs %d): the figures hardly compare\n", old.CPU, cur.CPU, old.GOMAXPROCS, cur.GOMAXPROCS)
	}
	for _, r := range []*Report{old, cur} {
		if r.Failed {
			fmt.Fprintf(w, "warning: the run of %s failed: its results are incomplete\n", r.Time)
		}
	}
	fmt.Fprintln(w)
	t := &table{right: []bool{false, false, true, true, false, true, false}}
	t.add("benchmark", "metric", "old", "new", "unit", "change", "")
	prev := ""
	counts := map[string]int{}
	anyOverlap := false
	for _, c := range changes {
		name := c.Benchmark
		if name == prev {
			name = ""
		}
		prev = c.Benchmark
		ref := c.New
		if ref == nil {
			ref = c.Old
		}
		// One scale for both sides, chosen by the larger.
		big := 0.0
		for _, r := range []*Result{c.Old, c.New} {
			if r != nil {
				big = max(big, math.Abs(r.Value))
			}
		}
		label, unit, f := scale(ref.Metric, ref.Unit, big)
		ov, nv, pct := "", "", ""
		if c.Old != nil {
			ov = num(c.Old.Value * f)
		}
		if c.New != nil {
			nv = num(c.New.Value * f)
		}
		if !math.IsNaN(c.Percent) {
			pct = fmt.Sprintf("%+.1f%%", c.Percent)
		}
		verdict := c.Verdict
		if c.Overlap && (verdict == "better" || verdict == "worse") {
			verdict += "?"
			anyOverlap = true
		}
		counts[c.Verdict]++
		t.add(name, label, ov, nv, unit, pct, verdict)
	}
	t.print(w)
	fmt.Fprintln(w)
	var sum []string
	for _, v := range []string{"better", "worse", "same", "new", "gone"} {
		if counts[v] > 0 {
			sum = append(sum, fmt.Sprintf("%d %s", counts[v], v))
		}
	}
	fmt.Fprintf(w, "%s (same: within ±%g%%; better or worse by each metric's direction: lower or higher is better)\n", strings.Join(sum, ", "), threshold)
	if anyOverlap {
		fmt.Fprintln(w, "?: the min–max ranges of the runs overlap: the change may be noise.")
	}
}
