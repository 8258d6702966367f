package snaps

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/offsite"
	"curia.dev/platform/snapshots"
)

// Copies of the leader's snapshots off-site (issue 31), with
// --snapshot-offsite s3://bucket/prefix: the snapshot directory dies with
// its volume; the object storage does not.
//
//	every second, while leading: the directory's newest snapshot, taken by
//	this replica and not copied yet ─▶ upload (platform/offsite: checked,
//	sent, HEAD checked) ─▶ retention off-site ─▶ list, for ListSnapshots
//
// Only the replica that took a snapshot copies it, once it is complete
// and verified in the directory (it has its .json). A copy that fails is
// logged and counted, never fails the snapshot, and is tried again after
// the schedule's retry delay, for the newest snapshot then.

// offsiteListTimeout bounds the listing after each copy.
const offsiteListTimeout = 30 * time.Second

// offsiter copies the leader's snapshots off-site.
type offsiter struct {
	sn     *Snapshotter
	client *offsite.Client
	keep   int
	log    *slog.Logger

	failures    prometheus.Counter
	lastSuccess prometheus.Gauge

	mu sync.Mutex
	// copied is the newest snapshot this replica copied (or found
	// copied), so that it is not sent again.
	copied string
	// listed is the snapshots off-site at the last look, newest first;
	// listErr why the last look failed.
	listed  []offsite.Metadata
	listErr string
	// The last copy: when one last succeeded, why the last failed.
	lastSuccessAt time.Time
	lastFailure   string
}

func newOffsiter(sn *Snapshotter, cfg Config, log *slog.Logger) (*offsiter, error) {
	client, err := offsite.New(cfg.Offsite, cfg.S3)
	if err != nil {
		return nil, fmt.Errorf("--snapshot-offsite: %w", err)
	}
	return &offsiter{
		sn: sn, client: client, keep: cfg.OffsiteKeep, log: log,
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "curia_curator_snapshot_offsite_failures_total", Help: "Copies of etcd snapshots off-site (--snapshot-offsite) that this replica failed to make, while it led.",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "curia_curator_snapshot_offsite_last_success_timestamp_seconds", Help: "When this replica last copied an etcd snapshot off-site, verified (unix seconds; 0: never since it started).",
		}),
	}, nil
}

// validateOffsite checks the off-site flags (only when set).
func (c *Config) validateOffsite() error {
	if c.Offsite == "" {
		return nil
	}
	if _, err := offsite.New(c.Offsite, c.S3); err != nil {
		return fmt.Errorf("--snapshot-offsite: %w", err)
	}
	if c.OffsiteKeep < 1 {
		return fmt.Errorf("--snapshot-offsite-keep %d: at least 1", c.OffsiteKeep)
	}
	return nil
}

// run copies, while this replica leads (the file comment).
func (o *offsiter) run(ctx context.Context) {
	t := time.NewTicker(snapshotTick)
	defer t.Stop()
	var term int64
	var retryAt time.Time
	retry := snapshotRetry
	if iv := o.sn.cfg.Interval; iv > 0 {
		retry = min(iv, snapshotRetry)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, cur, leads := o.sn.Lead.Ours()
		if !leads {
			term = 0
			continue
		}
		if cur != term {
			// A new term: look what is off-site (for ListSnapshots).
			term, retryAt = cur, time.Time{}
			o.list(ctx)
		}
		n := o.sn.newestGood()
		if n == nil || n.TakenBy != o.sn.Name || n.Name == o.copiedName() || time.Now().Before(retryAt) {
			continue
		}
		if err := o.copy(ctx, *n); err != nil {
			o.failures.Inc()
			o.log.Warn("copy off-site failed", "name", n.Name, "target", o.client.Target().String(), "retry_in", retry, "err", err)
			o.mu.Lock()
			o.lastFailure = err.Error()
			o.mu.Unlock()
			retryAt = time.Now().Add(retry)
			continue
		}
		retryAt = time.Time{}
	}
}

func (o *offsiter) copiedName() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.copied
}

// copy uploads the snapshot md from the directory, applies the
// retention off-site and lists what is left.
func (o *offsiter) copy(ctx context.Context, md snapshots.Metadata) error {
	cctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	start := time.Now()
	up, err := o.client.Upload(cctx, md, o.sn.dir.DB(md.Name))
	if err != nil {
		return err
	}
	now := time.Now()
	o.lastSuccess.Set(float64(now.UnixNano()) / 1e9)
	o.mu.Lock()
	o.copied, o.lastSuccessAt, o.lastFailure = md.Name, now, ""
	o.mu.Unlock()
	o.log.Info("snapshot copied off-site", "name", md.Name, "url", up.URL, "size", up.Size, "took", now.Sub(start).Round(time.Millisecond))
	deleted, err := o.client.Prune(cctx, o.keep, md.Name)
	for _, name := range deleted {
		o.log.Info("snapshot deleted off-site", "name", name, "keep", o.keep)
	}
	if err != nil {
		// The copy is made; the retention runs again after the next.
		o.log.Warn("retention off-site", "target", o.client.Target().String(), "err", err)
	}
	o.list(ctx)
	return nil
}

// list looks what is off-site.
func (o *offsiter) list(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, offsiteListTimeout)
	defer cancel()
	list, err := o.client.List(lctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		o.listErr = err.Error()
		o.log.Warn("list snapshots off-site", "target", o.client.Target().String(), "err", err)
		return
	}
	o.listed, o.listErr = list, ""
}

// annotate adds what is off-site to ListSnapshots' answer, made of the
// directory's snapshots: each one's storage, and the snapshots off-site
// only, in their place (newest first).
func (o *offsiter) annotate(resp *curatorv1.ListSnapshotsResponse) {
	o.mu.Lock()
	listed, listErr := o.listed, o.listErr
	o.mu.Unlock()
	resp.Offsite, resp.OffsiteError = o.client.Target().String(), listErr
	off := map[string]offsite.Metadata{}
	for _, md := range listed {
		off[md.Name] = md
	}
	for _, s := range resp.Snapshots {
		if md, ok := off[s.Name]; ok {
			s.Storage, s.OffsiteUrl = curatorv1.SnapshotStorage_SNAPSHOT_STORAGE_LOCAL_AND_OFFSITE, md.URL
			delete(off, s.Name)
		}
	}
	if len(off) == 0 {
		return
	}
	all := make([]snapshots.Metadata, 0, len(resp.Snapshots)+len(off))
	byName := map[string]*curatorv1.SnapshotMetadata{}
	for _, s := range resp.Snapshots {
		all = append(all, snapshots.Metadata{Name: s.Name, TakenAt: s.TakenAt.AsTime(), Revision: s.Revision})
		byName[s.Name] = s
	}
	for _, md := range off {
		all = append(all, snapshots.Metadata{Name: md.Name, TakenAt: md.TakenAt, Revision: md.Revision})
		byName[md.Name] = &curatorv1.SnapshotMetadata{
			Name: md.Name, TakenAt: timestamppb.New(md.TakenAt), Revision: md.Revision,
			Size: md.Size, Sha256: md.SHA256, TakenBy: md.TakenBy,
			Storage: curatorv1.SnapshotStorage_SNAPSHOT_STORAGE_OFFSITE, OffsiteUrl: md.URL,
		}
	}
	snapshots.Sort(all)
	resp.Snapshots = resp.Snapshots[:0]
	for _, md := range all {
		resp.Snapshots = append(resp.Snapshots, byName[md.Name])
	}
}

// status adds the off-site copies to GetClusterInfo's snapshots.
func (o *offsiter) status(st *curatorv1.SnapshotStatus) {
	o.mu.Lock()
	defer o.mu.Unlock()
	st.Offsite, st.OffsiteLastFailure = o.client.Target().String(), o.lastFailure
	if !o.lastSuccessAt.IsZero() {
		st.OffsiteLastSuccess = timestamppb.New(o.lastSuccessAt)
	}
}

func (o *offsiter) metrics() []prometheus.Collector {
	return []prometheus.Collector{o.failures, o.lastSuccess}
}
