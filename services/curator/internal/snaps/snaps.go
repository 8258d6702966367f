// Package snaps is the curator leader's etcd snapshots (issue 16) and
// their copies off-site (issue 31). The leader takes one every
// --snapshot-interval, on demand (Management/TakeSnapshot) and when the
// reconciler is about to change membership, into --snapshot-dir, in the
// layout of platform/snapshots, which recovery reads.
//
// It gets etcd's two clients (the cluster's, and one whose endpoints never
// change, for calls to one member), the replica's leadership (is it ours,
// which term) and the audit log's write; nothing else of the curator.
//
// Files: snaps.go (Config, the schedule, one snapshot at a time, the
// retention, the Management RPCs' bodies), take.go (one snapshot read,
// verified and written), offsite.go (the copies in S3-compatible storage).
package snaps

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/offsite"
	"curia.dev/platform/rpcerr"
	"curia.dev/platform/snapshots"
)

// Only the leader takes snapshots: followers forward the RPCs like every
// Management call, so the leader's directory is the one every caller sees.
// After each snapshot the leader applies the retention and removes what an
// interrupted write left.
//
//	schedule (every replica, acts while leading) ─┐
//	TakeSnapshot (admin; reconciler before a      ├─▶ take: one at a time, detached from
//	  membership change: a recent one reused) ────┘   the caller ─▶ snapshot (take.go):
//	                                                  read, verify, .db then .json ─▶ prune
//	ListSnapshots, GetSnapshot (admin) ─▶ the directory
//
// Several curators may share the directory (one volume on every replica):
// the newest snapshot in it tells a new leader when the next is due.

// Config configures the leader's etcd snapshots.
type Config struct {
	// Dir is the snapshot directory; empty: no snapshots.
	Dir string
	// Interval is how often the leader takes one; 0: only on demand and
	// before membership changes.
	Interval time.Duration
	// Keep and MaxAge are the retention: at most Keep snapshots, none
	// older than MaxAge; never the newest.
	Keep   int
	MaxAge time.Duration
	// ReuseWithin: a snapshot asked for before a membership change is the
	// newest one when that is younger than this (TakeSnapshot's rule).
	ReuseWithin time.Duration
	// Offsite is where the leader copies each snapshot it takes
	// (s3://bucket/prefix, offsite.go); empty: nowhere.
	// OffsiteKeep is its retention there: the newest, never the one just
	// copied. S3 reaches the object storage.
	Offsite     string
	OffsiteKeep int
	S3          offsite.Options
}

// AddFlags registers the snapshot flags.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Dir, "snapshot-dir", c.Dir, "directory of the leader's etcd snapshots (every curator may share one volume); off when empty: TakeSnapshot, ListSnapshots and GetSnapshot answer FailedPrecondition")
	fs.DurationVar(&c.Interval, "snapshot-interval", c.Interval, "how often the leader takes an etcd snapshot (0: only on demand and before membership changes)")
	fs.IntVar(&c.Keep, "snapshot-keep", c.Keep, "at most this many snapshots are kept, the newest")
	fs.DurationVar(&c.MaxAge, "snapshot-max-age", c.MaxAge, "snapshots older than this are deleted, but never the newest")
	fs.DurationVar(&c.ReuseWithin, "snapshot-reuse-within", c.ReuseWithin, "a snapshot asked for before a membership change is the newest one when that was taken less than this ago (0: always a new one)")
	fs.StringVar(&c.Offsite, "snapshot-offsite", c.Offsite, "S3-compatible object storage where the leader copies each snapshot it takes, s3://bucket/prefix (off when empty; the --s3-* flags reach it)")
	fs.IntVar(&c.OffsiteKeep, "snapshot-offsite-keep", c.OffsiteKeep, "at most this many snapshots are kept off-site, the newest (never the one just copied)")
	c.S3.AddFlags(fs, "")
}

// Validate checks the snapshot flags (only when snapshots are on).
func (c *Config) Validate() error {
	if c.Dir == "" {
		if c.Offsite != "" {
			return fmt.Errorf("--snapshot-offsite %s needs --snapshot-dir: snapshots are taken there, then copied", c.Offsite)
		}
		return nil
	}
	if c.Interval != 0 && c.Interval < time.Second {
		return fmt.Errorf("--snapshot-interval %v: 0 (no schedule) or at least 1s", c.Interval)
	}
	if c.Keep < 1 {
		return fmt.Errorf("--snapshot-keep %d: at least 1", c.Keep)
	}
	if c.MaxAge <= 0 || c.ReuseWithin < 0 {
		return fmt.Errorf("--snapshot-max-age %v must be positive, --snapshot-reuse-within %v not negative", c.MaxAge, c.ReuseWithin)
	}
	return c.validateOffsite()
}

const (
	// snapshotTimeout bounds one snapshot, read, verified and written.
	snapshotTimeout = 10 * time.Minute
	// snapshotLeftoverAge: a .part, or a .db without its .json, this old
	// is no write in progress (each is bounded by snapshotTimeout).
	snapshotLeftoverAge = 2 * snapshotTimeout
	// snapshotRetry: a scheduled snapshot that failed is tried again
	// after this long (or the interval, when shorter).
	snapshotRetry = time.Minute
	// snapshotTick is how often the schedule looks whether a snapshot is
	// due, and followerRefresh how often a follower reads the directory
	// again (for its metrics).
	snapshotTick    = time.Second
	followerRefresh = time.Minute
	// snapshotAuditTimeout bounds the audit write of a TakeSnapshot.
	snapshotAuditTimeout = 5 * time.Second
	// snapshotChunk is the size of GetSnapshot's chunks: a multiple of 3,
	// so that their base64 (JSON) concatenates to the file's.
	snapshotChunk = 3 << 18
)

// Leadership is this replica's leadership.
type Leadership interface {
	// Ours is the leader key and term while this replica leads.
	Ours() (key string, term int64, ok bool)
}

// Deps is what the snapshots need of the curator.
type Deps struct {
	// Etcd is the cluster's client; Member calls one member by its
	// endpoint (its endpoints never change).
	Etcd, Member *clientv3.Client
	Lead         Leadership
	// Cluster and Name: the cluster's, and this replica's (TakenBy).
	Cluster, Name string
	// Audit writes an audit event (AUDIT_ACTION_SNAPSHOT) under the
	// leader's term.
	Audit func(ctx context.Context, why string) error
}

// Snapshotter takes the leader's snapshots and serves the directory.
type Snapshotter struct {
	Deps
	cfg      Config
	dir      snapshots.Dir
	log      *slog.Logger
	failures prometheus.Counter
	// one is held while this replica takes a snapshot: one at a time.
	one chan struct{}
	// off copies the snapshots off-site (nil without --snapshot-offsite).
	off *offsiter

	mu sync.Mutex
	// newest is the newest snapshot of the directory as last seen.
	newest *snapshots.Metadata
	// The last failed attempt while this replica led.
	lastFailure   string
	lastFailureAt time.Time
}

// New prepares the snapshots; nothing runs until Run.
func New(cfg Config, d Deps, log *slog.Logger) (*Snapshotter, error) {
	sn := &Snapshotter{
		Deps: d, cfg: cfg, dir: snapshots.Dir(cfg.Dir), log: log, one: make(chan struct{}, 1),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "curia_curator_snapshot_failures_total", Help: "etcd snapshots this replica failed to take (read, verify or write), while it led.",
		}),
	}
	if cfg.Dir != "" {
		if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("--snapshot-dir: %w", err)
		}
	}
	if cfg.Offsite != "" {
		off, err := newOffsiter(sn, cfg, log)
		if err != nil {
			return nil, err
		}
		sn.off = off
	}
	return sn, nil
}

// on says whether snapshots are on, and if not, why not.
func (sn *Snapshotter) on() error {
	if sn.cfg.Dir == "" {
		return fmt.Errorf("%w: the curator leader (%s) runs without --snapshot-dir: give every curator the same --snapshot-dir (a directory all of them reach, e.g. one volume) to take snapshots", rpcerr.SnapshotsOff, sn.Name)
	}
	return nil
}

// Run is the schedule, on every replica: while this replica leads, it
// takes a snapshot when the newest of the directory is an interval old
// (at once for a new leader of a directory without a recent one). A
// follower only reads the directory now and then, for its metrics.
//
// With --snapshot-offsite it copies them too (offsite.go), while it leads.
func (sn *Snapshotter) Run(ctx context.Context) error {
	if sn.off != nil {
		done := make(chan struct{})
		go func() { defer close(done); sn.off.run(ctx) }()
		defer func() { <-done }()
	}
	return sn.schedule(ctx)
}

// schedule is Run's schedule.
func (sn *Snapshotter) schedule(ctx context.Context) error {
	sn.refresh()
	t := time.NewTicker(snapshotTick)
	defer t.Stop()
	var term int64
	var retryAt, refreshed time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := time.Now()
		_, cur, leads := sn.Lead.Ours()
		if !leads {
			term = 0
			if now.Sub(refreshed) > followerRefresh {
				sn.refresh()
				refreshed = now
			}
			continue
		}
		if cur != term {
			// A new term: the directory, maybe written by the leader
			// before, says when the next snapshot is due.
			term, retryAt = cur, time.Time{}
			sn.refresh()
		}
		if sn.cfg.Interval == 0 || now.Before(retryAt) {
			continue
		}
		if n := sn.newestGood(); n != nil && now.Sub(n.TakenAt) < sn.cfg.Interval {
			continue
		}
		if _, _, err := sn.take(ctx, request{trigger: snapshots.Scheduled, reason: "scheduled"}); err != nil {
			retryAt = time.Now().Add(min(sn.cfg.Interval, snapshotRetry))
		}
	}
}

// refresh reads the directory's newest snapshot.
func (sn *Snapshotter) refresh() {
	list, err := sn.dir.List()
	if err != nil {
		sn.log.Warn("list snapshots", "dir", sn.cfg.Dir, "err", err)
		return
	}
	sn.noteNewest(list)
}

func (sn *Snapshotter) noteNewest(list []snapshots.Metadata) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	sn.newest = nil
	if len(list) > 0 {
		sn.newest = &list[0]
	}
}

// newestGood is the newest snapshot as last seen, nil when none.
func (sn *Snapshotter) newestGood() *snapshots.Metadata {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	return sn.newest
}

// request is why a snapshot is asked for.
type request struct {
	trigger     snapshots.Trigger
	reason      string // the metadata's Reason
	requestedBy string // who asked ("" for the schedule)
	// mayReuse: a snapshot taken less than ReuseWithin ago will do.
	mayReuse bool
}

// take returns a snapshot for req: a recent one when req allows it, else
// a new one. Snapshots are taken one at a time, each under a context of its
// own, so that a caller who gives up (the reconciler after its bound) does
// not waste it: the next caller's rule finds it. Every call asked for over
// the API (not the schedule's) is written to the audit log.
func (sn *Snapshotter) take(ctx context.Context, req request) (snapshots.Metadata, bool, error) {
	if md, ok := sn.recent(req); ok {
		return md, true, sn.audit(ctx, req, md, true)
	}
	select {
	case sn.one <- struct{}{}:
	case <-ctx.Done():
		return snapshots.Metadata{}, false, fmt.Errorf("%w: waited for the snapshot in progress: %v", rpcerr.Unavailable, ctx.Err())
	}
	if md, ok := sn.recent(req); ok { // the one in progress was taken meanwhile
		<-sn.one
		return md, true, sn.audit(ctx, req, md, true)
	}
	type result struct {
		md  snapshots.Metadata
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-sn.one }()
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotTimeout)
		defer cancel()
		md, err := sn.snapshot(tctx, req)
		sn.noteResult(req, md, err)
		if err == nil {
			err = sn.audit(tctx, req, md, false)
		}
		done <- result{md, err}
	}()
	select {
	case r := <-done:
		return r.md, false, r.err
	case <-ctx.Done():
		return snapshots.Metadata{}, false, fmt.Errorf("%w: the snapshot is still being taken (ListSnapshots shows it once it is): %v", rpcerr.Unavailable, ctx.Err())
	}
}

// recent is the newest snapshot when req may have it instead of a new one.
func (sn *Snapshotter) recent(req request) (snapshots.Metadata, bool) {
	if !req.mayReuse || sn.cfg.ReuseWithin <= 0 {
		return snapshots.Metadata{}, false
	}
	n := sn.newestGood()
	if n == nil || time.Since(n.TakenAt) >= sn.cfg.ReuseWithin {
		return snapshots.Metadata{}, false
	}
	return *n, true
}

// noteResult records how an attempt ended: for the status, the metrics
// and the log.
func (sn *Snapshotter) noteResult(req request, md snapshots.Metadata, err error) {
	if err != nil {
		sn.failures.Inc()
		sn.log.Warn("snapshot failed", "trigger", req.trigger, "reason", req.reason, "err", err)
		sn.mu.Lock()
		sn.lastFailure, sn.lastFailureAt = err.Error(), time.Now()
		sn.mu.Unlock()
		return
	}
	sn.log.Info("snapshot taken", "name", md.Name, "revision", md.Revision, "size", md.Size,
		"member", md.Source.ID, "trigger", req.trigger, "reason", req.reason)
}

// audit records a TakeSnapshot call (not the schedule's) in the audit log.
func (sn *Snapshotter) audit(ctx context.Context, req request, md snapshots.Metadata, reused bool) error {
	if req.trigger == snapshots.Scheduled {
		return nil
	}
	why := fmt.Sprintf("snapshot %s taken (%s)", md.Name, req.reason)
	if reused {
		why = fmt.Sprintf("snapshot %s, taken %v ago, handed out instead of a new one (%s)", md.Name, time.Since(md.TakenAt).Round(time.Millisecond), req.reason)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotAuditTimeout)
	defer cancel()
	if err := sn.Audit(actx, why); err != nil {
		return fmt.Errorf("record snapshot %s in the audit log: %w", md.Name, err)
	}
	return nil
}

// prune applies the retention after a snapshot, and removes what
// interrupted writes left. Only the leader deletes.
func (sn *Snapshotter) prune(now time.Time) {
	list, err := sn.dir.List()
	if err != nil {
		sn.log.Warn("list snapshots for the retention", "err", err)
		return
	}
	for _, md := range snapshots.Expired(list, sn.cfg.Keep, sn.cfg.MaxAge, now) {
		if _, _, ok := sn.Lead.Ours(); !ok {
			return
		}
		if err := sn.dir.Remove(md.Name); err != nil {
			sn.log.Warn("delete snapshot", "name", md.Name, "err", err)
			continue
		}
		sn.log.Info("snapshot deleted", "name", md.Name, "taken_at", md.TakenAt, "keep", sn.cfg.Keep, "max_age", sn.cfg.MaxAge)
	}
	left, err := sn.dir.Leftovers(now, snapshotLeftoverAge)
	if err != nil {
		sn.log.Warn("look for leftovers in the snapshot directory", "err", err)
	}
	for _, f := range left {
		if _, _, ok := sn.Lead.Ours(); !ok {
			return
		}
		if err := os.Remove(filepath.Join(sn.cfg.Dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			sn.log.Warn("remove a leftover of the snapshot directory", "file", f, "err", err)
			continue
		}
		sn.log.Info("removed a leftover of the snapshot directory (no snapshot)", "file", f)
	}
	sn.refresh()
}

// Status is the snapshots' part of GetClusterInfo.
func (sn *Snapshotter) Status() *curatorv1.SnapshotStatus {
	st := &curatorv1.SnapshotStatus{Enabled: sn.cfg.Dir != "", Directory: sn.cfg.Dir}
	if !st.Enabled {
		return st
	}
	st.Interval = durationpb.New(sn.cfg.Interval)
	if n := sn.newestGood(); n != nil {
		st.LastGood = metadataProto(*n)
	}
	if sn.off != nil {
		sn.off.status(st)
	}
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.lastFailure != "" {
		st.LastFailure = sn.lastFailure
		st.LastFailureTime = timestamppb.New(sn.lastFailureAt)
	}
	return st
}

// Metrics are the snapshots' metrics: the newest snapshot as this replica
// last saw the directory (the leader's are current), and the failures.
func (sn *Snapshotter) Metrics() []prometheus.Collector {
	newest := func(f func(*snapshots.Metadata) float64) func() float64 {
		return func() float64 {
			if n := sn.newestGood(); n != nil {
				return f(n)
			}
			return 0
		}
	}
	var off []prometheus.Collector
	if sn.off != nil {
		off = sn.off.metrics()
	}
	return append(off,
		sn.failures,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "curia_curator_snapshot_last_success_timestamp_seconds", Help: "When the newest good etcd snapshot of the snapshot directory was taken (unix seconds; 0: none). The leader's is current; a follower's is as of its last look (a minute at most).",
		}, newest(func(n *snapshots.Metadata) float64 { return float64(n.TakenAt.UnixNano()) / 1e9 })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "curia_curator_snapshot_last_success_revision", Help: "etcd revision of the newest good snapshot of the snapshot directory (0: none).",
		}, newest(func(n *snapshots.Metadata) float64 { return float64(n.Revision) })),
	)
}

// TakeSnapshot is Management/TakeSnapshot's body, asked for by who.
func (sn *Snapshotter) TakeSnapshot(ctx context.Context, req *curatorv1.TakeSnapshotRequest, who string) (*curatorv1.TakeSnapshotResponse, error) {
	if err := sn.on(); err != nil {
		return nil, err
	}
	r := request{trigger: snapshots.OnDemand, requestedBy: who, reason: "on demand by " + who}
	if req.GetReason() != "" {
		r.reason += ": " + req.GetReason()
	}
	if change := req.GetBeforeMembershipChange(); change != "" {
		r.trigger, r.mayReuse = snapshots.BeforeMembershipChange, true
		r.reason = "before membership change: " + change
		if req.GetReason() != "" {
			r.reason += " (" + req.GetReason() + ")"
		}
	}
	md, reused, err := sn.take(ctx, r)
	if err != nil {
		return nil, err
	}
	return &curatorv1.TakeSnapshotResponse{Snapshot: metadataProto(md), Reused: reused}, nil
}

// ListSnapshots is Management/ListSnapshots' body.
func (sn *Snapshotter) ListSnapshots() (*curatorv1.ListSnapshotsResponse, error) {
	if err := sn.on(); err != nil {
		return nil, err
	}
	list, err := sn.dir.List()
	if err != nil {
		return nil, fmt.Errorf("%w: list the snapshot directory %s: %v", rpcerr.Unavailable, sn.cfg.Dir, err)
	}
	sn.noteNewest(list)
	resp := &curatorv1.ListSnapshotsResponse{Directory: sn.cfg.Dir}
	for _, md := range list {
		resp.Snapshots = append(resp.Snapshots, metadataProto(md))
	}
	if sn.off != nil {
		sn.off.annotate(resp)
	}
	return resp, nil
}

// GetSnapshot is Management/GetSnapshot's body.
func (sn *Snapshotter) GetSnapshot(req *curatorv1.GetSnapshotRequest, stream curatorv1.Management_GetSnapshotServer) error {
	if err := sn.on(); err != nil {
		return err
	}
	name := req.GetName()
	md, err := sn.dir.Read(name)
	switch {
	case errors.Is(err, snapshots.ErrBadName):
		return fmt.Errorf("%w: %v", rpcerr.Invalid, err)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: no snapshot %s in the snapshot directory (ListSnapshots lists them)", rpcerr.NotFound, name)
	case err != nil:
		return fmt.Errorf("%w: the metadata of snapshot %s does not read: %v", rpcerr.Corrupt, name, err)
	}
	f, err := os.Open(sn.dir.DB(name))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: snapshot %s was deleted meanwhile (ListSnapshots lists those left)", rpcerr.NotFound, name)
	}
	if err != nil {
		return fmt.Errorf("%w: open snapshot %s: %v", rpcerr.Unavailable, name, err)
	}
	defer f.Close()
	if err := stream.Send(&curatorv1.GetSnapshotResponse{Snapshot: metadataProto(md)}); err != nil {
		return err
	}
	buf := make([]byte, snapshotChunk)
	var sent int64
	for {
		n, err := io.ReadFull(f, buf)
		if n > 0 {
			// Send encodes the message before it returns: buf is free again.
			if err := stream.Send(&curatorv1.GetSnapshotResponse{Chunk: buf[:n]}); err != nil {
				return err
			}
			sent += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: read snapshot %s: %v", rpcerr.Unavailable, name, err)
		}
	}
	if sent != md.Size {
		return fmt.Errorf("%w: snapshot %s is %d bytes, its metadata says %d: the file changed", rpcerr.Corrupt, name, sent, md.Size)
	}
	return nil
}

// metadataProto is the API's form of a snapshot's metadata.
func metadataProto(md snapshots.Metadata) *curatorv1.SnapshotMetadata {
	member := func(m snapshots.Member) *curatorv1.SnapshotMember {
		id, _ := m.MemberID() // written by us: hex
		return &curatorv1.SnapshotMember{Id: id, Name: m.Name, PeerUrls: m.PeerURLs, Learner: m.Learner}
	}
	out := &curatorv1.SnapshotMetadata{
		Name: md.Name, TakenAt: timestamppb.New(md.TakenAt), Revision: md.Revision,
		Source: member(md.Source), Size: md.Size, Sha256: md.SHA256,
		EtcdHash: md.EtcdHash, TotalKeys: int64(md.TotalKeys), StorageVersion: md.StorageVersion,
		Trigger: snapshotTriggers[md.Trigger], Reason: md.Reason, RequestedBy: md.RequestedBy, TakenBy: md.TakenBy,
		Storage: curatorv1.SnapshotStorage_SNAPSHOT_STORAGE_LOCAL,
	}
	for _, m := range md.Members {
		out.Members = append(out.Members, member(m))
	}
	return out
}

// snapshotTriggers are the file's triggers as the API names them.
var snapshotTriggers = map[snapshots.Trigger]curatorv1.SnapshotTrigger{
	snapshots.Scheduled:              curatorv1.SnapshotTrigger_SNAPSHOT_TRIGGER_SCHEDULED,
	snapshots.OnDemand:               curatorv1.SnapshotTrigger_SNAPSHOT_TRIGGER_ON_DEMAND,
	snapshots.BeforeMembershipChange: curatorv1.SnapshotTrigger_SNAPSHOT_TRIGGER_BEFORE_MEMBERSHIP_CHANGE,
}
