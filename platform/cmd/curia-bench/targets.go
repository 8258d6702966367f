package main

// knownTargets is the one table of what a benchmark's metric should reach:
// the benchmark's name as `go test` prints it (without the -GOMAXPROCS
// suffix), the metric as printed (the unit string of b.ReportMetric, or
// ns/op), the target in that metric's own unit (ns for ns/op), which way is
// better, and where the figure comes from. An entry's direction wins over
// the rules of direction(). `curia-bench report -targets FILE` adds to or
// replaces entries of this table for one run.
var knownTargets = []Target{
	{Benchmark: "BenchmarkRoleUpdates", Metric: "ratio", Value: 0.7, Better: Higher,
		Source: `issue "Speed and scale": role updates through the curator ≥ 0.7 × raw guarded etcd txns`},
	{Benchmark: "BenchmarkGetNodes10k", Metric: "ns/op", Value: 50e6, Better: Lower,
		Source: `issue "Speed and scale": GetNodes streams 10k nodes in ≤ 50 ms`},
	{Benchmark: "BenchmarkWatchFanout/watchers=1000", Metric: "ms/delivery-p99", Value: 10, Better: Lower,
		Source: `issue "Speed and scale": a change reaches 1000 watchers in ≤ 10 ms p99`},
	{Benchmark: "BenchmarkColdStart", Metric: "s/cluster-ready", Value: 15, Better: Lower,
		Source: `issue "Speed and scale": make run cold start (binaries built) → 3 voters in ≤ 15 s`},
	{Benchmark: "BenchmarkLearnerToVoter", Metric: "ns/op", Value: 5e9, Better: Lower,
		Source: `issue "Speed and scale": a learner started is a voter in ≤ 5 s, with the default stabilization`},
	{Benchmark: "BenchmarkTakeover", Metric: "ms/over-ttl", Value: 500, Better: Lower,
		Source: `issue "Speed and scale": a frozen active reconciler's standby acts ≤ lease TTL + 0.5 s`},
	{Benchmark: "BenchmarkCuratorFailover", Metric: "ms/over-ttl", Value: 500, Better: Lower,
		Source: `issue "Speed and scale": curator leader kill -9 → admin calls answered ≤ TTL + 0.5 s`},
	{Benchmark: "BenchmarkDrift", Metric: "ms/noticed", Value: 250, Better: Lower,
		Source: `issue "Speed and scale": drift noticed in ≤ 250 ms`},
	{Benchmark: "BenchmarkDrift", Metric: "ms/consistent", Value: 500, Better: Lower,
		Source: `issue "Speed and scale": consistent again ≤ 500 ms after a drift`},
	{Benchmark: "BenchmarkDashboardPages50", Metric: "ms/slowest-page", Value: 200, Better: Lower,
		Source: `issue 15: dashboard pages load in under 200 ms on a 50-node cluster`},
	{Benchmark: "BenchmarkDrift10", Metric: "ms/consistent", Value: 1000, Better: Lower,
		Source: `issue "Speed and scale": 10 drifts consistent ≤ 10 × etcd's hold + 1 s (role drifts: no hold)`},
}
