package curator_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"curia.dev/platform/keys"
	ct "curia.dev/services/consensus/consensustest"
	"curia.dev/services/curator"
)

// Heartbeat designs side by side (issue "Speed and scale": etcd leases per
// node vs. batched health records). Each design's write pattern for N
// nodes is driven straight into a 3-voter etcd, at the curator's default
// interval (5 s) and timeout (20 s), every write guarded by a leader key
// as the curator's are; no curator runs, so the figures are etcd's alone.
//
//	leases          the design before the shards: a lease per node; each beat
//	                renews it (KeepAliveOnce: no raft entry), and the
//	                heartbeat and heartbeats-seen keys are rewritten in one
//	                transaction when the recorded time is timeout/2 old
//	batched-keys    the leader keeps beats in memory and every timeout/2
//	                writes the heartbeats-seen key of each node that beat
//	                since, 128 puts a transaction (etcd's --max-txn-ops)
//	batched-shards  the same, one record per 1,000 nodes (their ids and
//	                last beats), every record in one transaction
//
// The batched designs keep what heartbeats promise today: the time in etcd
// lags the last beat by less than timeout/2, so a leader that takes over
// knows every node's last heartbeat to within that. A health change
// (HEARTBEAT_TIMEOUT) is one more write at the moment it happens; in a
// steady state there is none.
var heartbeatDesigns = []struct {
	name string
	run  func(ctx context.Context, d *designRun) error
}{
	{"leases", runLeases},
	{"batched-keys", runBatchedKeys},
	{"batched-shards", runBatchedShards},
}

const (
	// designMaxTxnOps is etcd's default --max-txn-ops, which curia's
	// consensus keeps.
	designMaxTxnOps = 128
	// designShard is how many nodes one batched-shards record holds.
	designShard = 1000
)

// BenchmarkHeartbeatDesigns drives each heartbeat design's writes for N
// nodes into a fresh 3-voter etcd (N node records seeded first) and
// measures, per b.Loop round of scaleWindow after the nodes are up:
//
//	etcd-writes/s, etcd-writes/node/min  etcd revisions (one per write
//	                                     transaction)
//	raft-entries/s                       etcd's raft index: writes plus
//	                                     lease grants and revokes
//	keys/node/min, KB-put/node/min       keys and bytes (key + value) the
//	                                     writes put
//	%cpu-etcd                            the three consensus processes, in
//	                                     % of one core
//	errors                               calls etcd failed
func BenchmarkHeartbeatDesigns(b *testing.B) {
	raiseFileLimit(b)
	for _, n := range scaleSizes {
		for _, design := range heartbeatDesigns {
			b.Run(fmt.Sprintf("n=%dk/%s", n/1000, design.name), func(b *testing.B) {
				benchDesign(b, n, design.run)
			})
		}
	}
}

func benchDesign(b *testing.B, n int, run func(context.Context, *designRun) error) {
	cc := ct.NewCluster(b)
	cc.Flags = scaleConsensusFlags()
	voters, leader := cc.Voters(3)
	var urls []string
	for _, v := range voters {
		urls = append(urls, v.ClientURL)
	}
	cli := cc.Etcd(urls...)
	cfg := curator.DefaultConfig()
	guard := leader.Fence.Conditions[0]
	d := &designRun{
		cli:      cli,
		ids:      seedNodes(b, cli, n),
		guard:    clientv3.Compare(clientv3.CreateRevision(guard.Key), "=", guard.CreateRevision),
		interval: cfg.HeartbeatInterval,
		timeout:  cfg.HeartbeatTimeout,
		up:       make(chan struct{}),
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Logf("driver: %v", err)
		}
	})
	go func() { done <- run(ctx, d) }()
	select {
	case <-d.up:
	case err := <-done:
		done <- err // for the cleanup
		b.Fatalf("bring %d nodes up: %v", n, err)
	case <-time.After(rampTimeout):
		b.Fatalf("%d nodes not up within %v", n, rampTimeout)
	}

	etcdCPU := func() time.Duration {
		var sum time.Duration
		for _, v := range voters {
			sum += cpuTime(b, v.PID())
		}
		return sum
	}
	var cpu, wall time.Duration
	var writes, keysPut, bytesPut, failed int64
	var entries uint64
	for b.Loop() {
		at, cpu0 := time.Now(), etcdCPU()
		rev0, raft0 := etcdProgress(b, cli, urls[0])
		keys0, bytes0, errors0 := d.keys.Load(), d.bytes.Load(), d.errors.Load()
		if !pause(ctx, scaleWindow) {
			b.Fatal(ctx.Err())
		}
		rev1, raft1 := etcdProgress(b, cli, urls[0])
		cpu += etcdCPU() - cpu0
		wall += time.Since(at)
		writes += rev1 - rev0
		entries += raft1 - raft0
		keysPut += d.keys.Load() - keys0
		bytesPut += d.bytes.Load() - bytes0
		failed += d.errors.Load() - errors0
	}
	perS := func(v int64) float64 { return float64(v) / wall.Seconds() }
	perNodeMin := func(v float64) float64 { return v * 60 / wall.Seconds() / float64(n) }
	b.ReportMetric(0, "ns/op") // a round is a fixed window: its time says nothing
	b.ReportMetric(perS(writes), "etcd-writes/s")
	b.ReportMetric(perNodeMin(float64(writes)), "etcd-writes/node/min")
	b.ReportMetric(float64(entries)/wall.Seconds(), "raft-entries/s")
	b.ReportMetric(perNodeMin(float64(keysPut)), "keys/node/min")
	b.ReportMetric(perNodeMin(float64(bytesPut)/1024), "KB-put/node/min")
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "%cpu-etcd")
	b.ReportMetric(float64(failed), "errors")
}

// designRun is what a design's driver works with.
type designRun struct {
	cli   *clientv3.Client
	ids   []string
	guard clientv3.Cmp // the leader key, as s.lead.Txn checks it
	// interval and timeout are the curator's defaults.
	interval, timeout time.Duration
	// up is closed once every node is up (the window may start).
	up chan struct{}
	// keys and bytes count what the design's writes put; errors, calls
	// that failed.
	keys, bytes, errors atomic.Int64
}

// txn writes ops under the guard and cmps, counting what they put.
func (d *designRun) txn(ctx context.Context, cmps []clientv3.Cmp, ops ...clientv3.Op) error {
	_, err := d.cli.Txn(ctx).If(append([]clientv3.Cmp{d.guard}, cmps...)...).Then(ops...).Commit()
	if err != nil {
		d.errors.Add(1)
		return err
	}
	for _, op := range ops {
		d.keys.Add(1)
		d.bytes.Add(int64(len(op.KeyBytes()) + len(op.ValueBytes())))
	}
	return nil
}

// beatTime is a heartbeat's time as the curator writes it.
func beatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// runLeases is the design before the shards, node by node: a fleet coming
// up grants a lease per node and writes both keys; from then on each node
// beats every interval (its phase spread over the interval), each beat
// renews its lease, and a beat at least timeout/2 after the recorded one
// writes both keys again, while the key is still bound to the lease.
func runLeases(ctx context.Context, d *designRun) error {
	leases := make([]clientv3.LeaseID, len(d.ids))
	recorded := make([]time.Time, len(d.ids))
	// Up: rampParallel nodes at a time.
	slots := make(chan struct{}, rampParallel)
	errs := make(chan error, len(d.ids))
	var wg sync.WaitGroup
	for i, id := range d.ids {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := d.grantAndRecord(ctx, id, &leases[i], &recorded[i]); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	// Steady state: after the first record that is not the fleet's
	// first (a beat timeout/2 after it, an interval at most later), each
	// node records every other beat.
	go func() {
		if pause(ctx, steadyAfter(d.interval, d.timeout)) {
			close(d.up)
		}
	}()

	for i, id := range d.ids {
		wg.Go(func() {
			phase := time.Duration(i) * d.interval / time.Duration(len(d.ids))
			if !pause(ctx, phase) {
				return
			}
			for pause(ctx, d.interval) {
				d.beat(ctx, id, &leases[i], &recorded[i])
			}
		})
	}
	wg.Wait()
	return nil
}

// beat is that design's beat for one node: renew the lease; when it is
// gone (the node was silent too long), a new lease and a fresh record;
// else a record only when the recorded time is timeout/2 old, and only
// while the key is still bound to the lease.
func (d *designRun) beat(ctx context.Context, id string, lease *clientv3.LeaseID, recorded *time.Time) {
	_, err := d.cli.KeepAliveOnce(ctx, *lease)
	now := time.Now()
	switch {
	case err == nil:
		if now.Sub(*recorded) < d.timeout/2 {
			return
		}
		v := beatTime(now)
		if d.txn(ctx, []clientv3.Cmp{nodeExists(id), clientv3.Compare(clientv3.LeaseValue(keys.Heartbeat(id)), "=", *lease)},
			clientv3.OpPut(keys.Heartbeat(id), v, clientv3.WithLease(*lease)),
			clientv3.OpPut(keys.HeartbeatSeen(id), v)) == nil {
			*recorded = now
		}
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		d.errors.Add(1)
		if err := d.grantAndRecord(ctx, id, lease, recorded); err != nil {
			d.errors.Add(1)
		}
	case ctx.Err() == nil:
		d.errors.Add(1)
	}
}

// grantAndRecord is a node's first beat on a stream: a lease, and both
// keys written with it.
func (d *designRun) grantAndRecord(ctx context.Context, id string, lease *clientv3.LeaseID, recorded *time.Time) error {
	granted, err := d.cli.Grant(ctx, int64(math.Ceil(d.timeout.Seconds())))
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	now := time.Now()
	v := beatTime(now)
	if err := d.txn(ctx, []clientv3.Cmp{nodeExists(id)},
		clientv3.OpPut(keys.Heartbeat(id), v, clientv3.WithLease(granted.ID)),
		clientv3.OpPut(keys.HeartbeatSeen(id), v)); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	*lease, *recorded = granted.ID, now
	return nil
}

// nodeExists is the curator's "the node exists" comparison.
func nodeExists(id string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(keys.Node(id)), ">", 0)
}

// lastBeats stands for the leader's memory of the beats in the batched
// designs: node i beat last at its phase in the current interval. The
// beats themselves never reach etcd; what they cost the leader (one
// stream each, as today, without the lease renewal) is not etcd's.
func lastBeats(d *designRun, now time.Time) func(i int) time.Time {
	return func(i int) time.Time {
		phase := time.Duration(i) * d.interval / time.Duration(len(d.ids))
		since := (time.Duration(now.UnixNano()) - phase) % d.interval
		return now.Add(-since)
	}
}

// flushEvery runs flush now and then every timeout/2 until ctx ends. It
// closes d.up half a period after the first flush began, so that windows
// of whole periods hold whole flushes.
func flushEvery(ctx context.Context, d *designRun, flush func(now time.Time) error) error {
	period := d.timeout / 2
	t := time.NewTicker(period)
	defer t.Stop()
	if err := flush(time.Now()); err != nil {
		return err
	}
	mid := time.AfterFunc(period/2, func() { close(d.up) })
	defer mid.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			// A failed write is counted (errors); the next flush writes
			// the same nodes again.
			_ = flush(now)
		}
	}
}

// runBatchedKeys: every timeout/2 the heartbeats-seen key of every node
// that beat since the last flush (in a steady state, all), in guarded
// transactions of designMaxTxnOps puts.
func runBatchedKeys(ctx context.Context, d *designRun) error {
	return flushEvery(ctx, d, func(now time.Time) error {
		last := lastBeats(d, now)
		var ops []clientv3.Op
		for i, id := range d.ids {
			ops = append(ops, clientv3.OpPut(keys.HeartbeatSeen(id), beatTime(last(i))))
			if len(ops) == designMaxTxnOps || i == len(d.ids)-1 {
				if err := d.txn(ctx, nil, ops...); err != nil {
					return err
				}
				ops = ops[:0]
			}
		}
		return nil
	})
}

// runBatchedShards: every timeout/2 one record per designShard nodes,
// "<id> <unix ms>" a line, every record in one guarded transaction (of at
// most designMaxTxnOps records).
func runBatchedShards(ctx context.Context, d *designRun) error {
	return flushEvery(ctx, d, func(now time.Time) error {
		last := lastBeats(d, now)
		var ops []clientv3.Op
		for lo := 0; lo < len(d.ids); lo += designShard {
			var rec strings.Builder
			for i := lo; i < min(lo+designShard, len(d.ids)); i++ {
				rec.WriteString(d.ids[i])
				rec.WriteByte(' ')
				rec.WriteString(strconv.FormatInt(last(i).UnixMilli(), 10))
				rec.WriteByte('\n')
			}
			ops = append(ops, clientv3.OpPut(keys.Prefix+"heartbeat-batches/"+strconv.Itoa(lo/designShard), rec.String()))
			if len(ops) == designMaxTxnOps {
				if err := d.txn(ctx, nil, ops...); err != nil {
					return err
				}
				ops = ops[:0]
			}
		}
		if len(ops) > 0 {
			return d.txn(ctx, nil, ops...)
		}
		return nil
	})
}
