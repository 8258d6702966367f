// Command curia-mutations shows that every safety mechanism has a test
// that catches its absence: for each mutation of platform/failpoint it
// runs the test the catalog names with the mechanism switched off
// (CURIA_MUTATIONS, -tags failpoints) and expects that test to fail. It
// prints one line per mutation and exits non-zero when a mutation went
// uncaught or its test could not run.
//
//	go run ./platform/cmd/curia-mutations            # every deterministic test
//	go run ./platform/cmd/curia-mutations no-quorum-guard no-crl-check
//
// Mutations only the fault suite catches are listed with the suite's test
// (make test-faults-mutations, root) and not run here.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// entry is one mutation and the test that catches it.
type entry struct {
	Mutation  string // platform/failpoint's name for it
	Mechanism string // what is switched off, in words
	Package   string // the catching test's package
	Test      string // go test -run pattern of the catching test
	Faults    bool   // caught by the fault suite's TestMutationsCaught only
}

// catalog is every mutation of platform/failpoint/mutations.go (a test
// checks none is missing).
var catalog = []entry{
	{"no-quorum-guard", "quorum guard before a voter's removal", "./services/consensus/", "^TestRemoveGuards$", false},
	{"any-leader-healthy", "quorum guard counts only the current term's followers", "./services/consensus/", "^TestQuorumGuardJudgesTheCurrentTerm$", false},
	{"no-fence-pairing", "a lease fences only with the leader term that granted it", "./services/consensus/", "^TestFencePairing$", false},
	{"no-epoch-compare", "fenced writes compare the membership epoch in their transaction", "./services/consensus/", "^TestLeadershipMovesAfterCommit$", false},
	{"no-finish-epoch-bump", "finishing a change moves the epoch", "./services/consensus/", "^TestOneChangeAtATime$", false},
	{"no-recorder-deadline", "the recorder's call deadline counts from before its commit", "./services/consensus/", "^TestPausedChangeResolvedNeverApplied$/^committed$", false},
	{"no-unstarted-check", "a learner removed for not starting has not started", "./services/consensus/", "^TestUnstartedOnlyKeepsAStartedLearner$", false},
	{"no-crl-check", "CRL enforcement on the APIs and etcd's client and peer ports", "./services/consensus/", "^TestEtcdRefusesRevoked$", false},
	{"crl-number-from-etcd", "a new CRL is numbered past the newest list known, not the stored one", "./services/curator/", "^TestCRLAfterRestore$", false},
	{"no-peer-cut", "the peer port closes the established connections of a revoked certificate", "./services/consensus/", "^TestPeerConnectionCutOnRevocation$", false},
	{"no-crl-union", "a new CRL keeps the revocations of the list held, not only the stored one", "./services/curator/", "^TestCRLAfterRestore$", false},
	{"no-old-member-crl-wait", "a member kept on disk waits for the curators' CRL before it restarts", "./services/consensus/", "^TestRecoveryFencesOldMembers$", false},
	{"no-cluster-pin", "an etcd client refuses the answers of another cluster than its pin", "./platform/etcdpin/", "^TestPinRefusesAnotherCluster$", false},
	{"no-tombstones", "a deleted node's id is never registered again", "./services/curator/", "^TestLifecycle$", false},
	{"no-term-guard", "the curator leader writes only while its term holds, compared in the write's txn", "./services/curator/", "^TestTxnRefusedAfterTermLost$", false},
	{"no-defrag-order", "defragmentation takes followers first, the leader after moving its leadership", "./services/curator/", "^TestDefragFollowersFirst$", false},
	{"no-pending", "one membership change at a time, cluster-wide", "./deploy/faults/", "TestMutationsCaught/no-pending", true},
	{"no-snapshot-freshness", "the reconciler plans only from a fresh node snapshot", "./deploy/faults/", "TestMutationsCaught/no-snapshot-freshness", true},
	{"no-absence-proof", "a member removed for want of a node is proven absent in the write", "./deploy/faults/", "TestMutationsCaught/no-absence-proof", true},
	{"no-incarnation", "reconciler leases are per incarnation", "./deploy/faults/", "TestMutationsCaught/no-incarnation", true},
}

func main() {
	timeout := flag.Duration("timeout", 5*time.Minute, "bound on each test run")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: curia-mutations [flags] [mutation ...]\n\nRuns, for each mutation (default: all not only caught by the fault suite), its catching test with the mutation on, and expects it to fail.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	var run []entry
	for _, e := range catalog {
		if flag.NArg() == 0 && !e.Faults || slices.Contains(flag.Args(), e.Mutation) {
			run = append(run, e)
		}
	}
	for _, name := range flag.Args() {
		if !slices.ContainsFunc(catalog, func(e entry) bool { return e.Mutation == name }) {
			fmt.Fprintf(os.Stderr, "curia-mutations: unknown mutation %q (see platform/failpoint/mutations.go)\n", name)
			os.Exit(2)
		}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "mutation\tmechanism switched off\tcaught by\tresult\ttook")
	failed := 0
	for _, e := range run {
		result, took := check(e, *timeout)
		if result != "caught" {
			failed++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s %s\t%s\t%v\n", e.Mutation, e.Mechanism, strings.TrimSuffix(strings.TrimPrefix(e.Package, "./"), "/"), e.Test, result, took.Round(time.Second))
		tw.Flush()
	}
	for _, e := range catalog {
		if e.Faults && !slices.Contains(run, e) {
			fmt.Fprintf(tw, "%s\t%s\t%s\tfault suite: make test-faults-mutations\t\n", e.Mutation, e.Mechanism, e.Test)
		}
	}
	tw.Flush()
	if failed > 0 {
		fmt.Fprintf(os.Stderr, "curia-mutations: %d of %d mutations not shown caught: a mechanism whose absence no test notices is not tested\n", failed, len(run))
		os.Exit(1)
	}
}

// check runs e's test with e's mutation on. "caught": the test failed;
// anything else says why it does not count.
func check(e entry, timeout time.Duration) (string, time.Duration) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args := []string{"test", "-tags", "failpoints", "-count=1", "-run", e.Test, e.Package}
	if e.Faults {
		args = []string{"test", "-tags", "faults", "-count=1", "-v", "-timeout", "60m", "-run", e.Test, e.Package}
	}
	cmd := exec.CommandContext(ctx, "go", args...) //nolint:gosec // G204: go test of the catalog's own packages
	cmd.Env = append(os.Environ(), "CURIA_MUTATIONS="+e.Mutation)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	took := time.Since(start)
	top := strings.SplitN(strings.TrimPrefix(e.Test, "^"), "$", 2)[0]
	top = strings.SplitN(top, "/", 2)[0]
	switch {
	case ctx.Err() != nil:
		return fmt.Sprintf("NOT CAUGHT: no result within %v", timeout), took
	case err == nil:
		if strings.Contains(out.String(), "no tests to run") {
			return "NOT RUN: no test matches " + e.Test, took
		}
		return "NOT CAUGHT: the test passed", took
	case regexp.MustCompile(`(?m)^--- FAIL: ` + regexp.QuoteMeta(top) + `\b`).Match(out.Bytes()):
		return "caught", took
	default:
		tail := strings.TrimSpace(out.String())
		if i := strings.LastIndex(tail, "\n"); len(tail) > 300 && i > 0 {
			tail = tail[max(0, len(tail)-300):]
		}
		return "NOT RUN: " + strings.ReplaceAll(tail, "\n", " | "), took
	}
}
