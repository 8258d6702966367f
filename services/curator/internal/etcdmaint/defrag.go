// Package etcdmaint keeps etcd's members serviceable: it observes them
// (every member's status, the alarms, the pending membership change),
// moves etcd's leadership off a member that is about to go, and
// defragments the members when it pays or when the NOSPACE alarm is
// raised. The curator's leader runs it; maintenance (a node out of service
// for a while) uses its observation and its leadership move.
//
// Files: observe.go (Observation, Observer: statuses and MoveLeader),
// defrag.go (Config, the plan, the Defragmenter and its NOSPACE recovery).
package etcdmaint

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
)

// The leader keeps etcd's database compact (issue 16). etcd frees the pages
// of compacted revisions inside its bolt file but never gives them back:
// the file only shrinks when a member is defragmented, and a member's
// defragmentation blocks every read and write it serves until it is done
// (it rewrites the whole database). So the leader defragments only when it
// pays, one member at a time, and only while the cluster is healthy:
//
//	every second (leader):  alarms ─▶ NOSPACE? ─▶ compact to the current revision,
//	                                               defragment every member, disarm
//	                                               once the database fits the quota
//	every --defrag-check-interval: statuses ─▶ planDefrag ─▶ defragment those
//	                                           fragmented past --defrag-threshold
//	                                           and --defrag-min-wasted-bytes
//
// etcd recomputes a member's in-use size when it commits a write: after a
// compaction, a member that writes nothing shows its old figure until it
// does (a live cluster writes all the time).
//
// Both runs observe (Observer.Observe: every member's status, the alarms,
// the pending membership change record), plan (planDefrag, pure) and apply
// (defragment): followers first, the etcd leader last, after its
// leadership moved to a caught-up voter (MoveLeader), each member answering
// and caught up again before the next. Healthy means every voter answers
// its status, they agree on a leader, and no membership change is pending
// (keys.MembershipPending, as the consensus service writes it); it never
// asks for a write, which NOSPACE refuses.

// Config configures the leader's defragmentation.
type Config struct {
	// CheckInterval is how often the leader looks whether defragmentation
	// pays; 0: never on a schedule (NOSPACE is still handled).
	CheckInterval time.Duration
	// Threshold is the fragmentation, (db size − in use) / db size, past
	// which a member is defragmented, when it also wastes MinWasted.
	Threshold float64
	MinWasted int64
}

// AddFlags registers the defragmentation flags.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.CheckInterval, "defrag-check-interval", c.CheckInterval, "how often the leader looks whether defragmenting etcd's members pays (0: never on a schedule; NOSPACE is still handled)")
	fs.Float64Var(&c.Threshold, "defrag-threshold", c.Threshold, "a member is defragmented when this share of its database is free pages ((db size - in use) / db size) ...")
	fs.Int64Var(&c.MinWasted, "defrag-min-wasted-bytes", c.MinWasted, "... and those free pages are at least this many bytes (small databases are left alone)")
}

// Validate checks the defragmentation flags.
func (c *Config) Validate() error {
	if c.CheckInterval != 0 && c.CheckInterval < time.Second {
		return fmt.Errorf("--defrag-check-interval %v: 0 (no schedule) or at least 1s", c.CheckInterval)
	}
	if c.Threshold <= 0 || c.Threshold >= 1 || c.MinWasted < 0 {
		return fmt.Errorf("--defrag-threshold %g must lie between 0 and 1, --defrag-min-wasted-bytes %d not be negative", c.Threshold, c.MinWasted)
	}
	return nil
}

const (
	// defragTick is how often the leader reads etcd's alarms.
	defragTick = time.Second
	// statusTimeout bounds each member's status call.
	statusTimeout = 2 * time.Second
	// defragCallTimeout bounds one member's defragmentation: it rewrites
	// the member's whole database, during which that member serves no
	// read or write (its clients wait, or go to other members).
	defragCallTimeout = 5 * time.Minute
	// catchUpTimeout bounds the wait for a defragmented member to
	// answer and apply what the etcd leader committed meanwhile, and for a
	// leadership move to show.
	catchUpTimeout = 30 * time.Second
	// moveLeaderMaxLag: a voter this many entries behind the etcd leader,
	// as their statuses read at about the same time, is caught up enough
	// to take its leadership (etcd's transfer waits for it to match the
	// leader's log before the leader steps down).
	moveLeaderMaxLag = 1000
	// nospaceRetry: a NOSPACE run that left the alarm raised is tried
	// again after this long.
	nospaceRetry = 5 * time.Second
	// defragAuditTimeout bounds the audit write of a NOSPACE recovery.
	defragAuditTimeout = 5 * time.Second
)

// The triggers of a run.
const (
	triggerFragmented = "fragmented"
	triggerNoSpace    = "NOSPACE"
)

// Plan is what a run does.
type Plan struct {
	// skip says why nothing is done ("" when something is).
	skip string
	// order is the members to defragment, in order: followers first, the
	// etcd leader last (its leadership moved first: MoveLeader).
	order      []Member
	moveLeader bool
}

// planDefrag chooses the members to defragment: on NOSPACE every member
// that answers, else those past the threshold and the floor; followers
// (learners among them) first, by most wasted, then the etcd leader. Nothing
// while the cluster is unhealthy.
func planDefrag(o Observation, cfg Config, trigger string) Plan {
	if why := o.Unhealthy(); why != "" {
		return Plan{skip: why}
	}
	leader, _ := o.Leader()
	var followers []Member
	var last *Member
	for _, m := range o.Members {
		if !m.Answered {
			continue // a learner that does not answer
		}
		if trigger != triggerNoSpace && (m.fragmentation() < cfg.Threshold || m.wasted() < cfg.MinWasted) {
			continue
		}
		if m.ID == leader {
			last = &m
			continue
		}
		followers = append(followers, m)
	}
	slices.SortStableFunc(followers, func(a, b Member) int { return cmp.Compare(b.wasted(), a.wasted()) })
	p := Plan{order: followers}
	if last != nil {
		p.order = append(p.order, *last)
		p.moveLeader = true
	}
	if len(p.order) == 0 {
		p.skip = "no member is fragmented enough"
	}
	return p
}

// Defragmenter runs the leader's defragmentation and watches the alarms.
type Defragmenter struct {
	Observer
	cfg   Config
	leads func() (term int64, ok bool)
	audit func(ctx context.Context, action auditv1.AuditAction, why string) error

	alarmsGauge  *prometheus.GaugeVec
	lastDefrag   *prometheus.GaugeVec
	reclaimed    prometheus.Counter
	failures     prometheus.Counter
	nospaceSteps *prometheus.CounterVec

	mu      sync.Mutex
	alarms  []string
	lastRun *curatorv1.EtcdMaintenanceStatus // the last run's fields only
}

// Deps is what a Defragmenter needs of the curator.
type Deps struct {
	Observer
	// Leads says whether this replica leads, and in which term.
	Leads func() (term int64, ok bool)
	// Audit records an event in the audit log, fenced by the leader's
	// term.
	Audit func(ctx context.Context, action auditv1.AuditAction, why string) error
}

// New is a Defragmenter of cfg; it acts once Run runs.
func New(cfg Config, deps Deps) *Defragmenter {
	return &Defragmenter{
		Observer: deps.Observer, cfg: cfg, leads: deps.Leads, audit: deps.Audit,
		alarmsGauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "curia_curator_etcd_alarms", Help: "etcd members with each active alarm (NOSPACE, CORRUPT), as the leader last read them.",
		}, []string{"alarm"}),
		lastDefrag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "curia_curator_etcd_defrag_last_timestamp_seconds", Help: "When this replica, leading, last defragmented each etcd member (unix seconds).",
		}, []string{"member"}),
		reclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "curia_curator_etcd_defrag_reclaimed_bytes_total", Help: "Bytes by which this replica's defragmentations shrank etcd members' databases.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "curia_curator_etcd_defrag_failures_total", Help: "etcd member defragmentations (or the leadership moves before them) that failed.",
		}),
		nospaceSteps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "curia_curator_etcd_nospace_steps_total", Help: "Steps of the NOSPACE recovery (compact, defragment, disarm) by result (ok, failed, waiting: the database is still over its quota).",
		}, []string{"step", "result"}),
	}
}

// Run is the schedule, on every replica; it acts while this replica leads.
func (d *Defragmenter) Run(ctx context.Context) error {
	for _, a := range []string{etcdserverpb.AlarmType_NOSPACE.String(), etcdserverpb.AlarmType_CORRUPT.String()} {
		d.alarmsGauge.WithLabelValues(a).Set(0)
	}
	t := time.NewTicker(defragTick)
	defer t.Stop()
	var term int64
	var nextCheck, nospaceAt time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cur, leads := d.leads()
		if !leads {
			term = 0
			continue
		}
		if cur != term {
			term, nextCheck, nospaceAt = cur, time.Now().Add(d.cfg.CheckInterval), time.Time{}
		}
		nospace, err := d.readAlarms(ctx)
		if err != nil {
			d.Log.Debug("read etcd alarms", "err", err)
			continue
		}
		now := time.Now()
		switch {
		case nospace && !now.Before(nospaceAt):
			if !d.recoverNoSpace(ctx) {
				nospaceAt = time.Now().Add(nospaceRetry)
			}
		case !nospace && d.cfg.CheckInterval > 0 && !now.Before(nextCheck):
			d.defragIfFragmented(ctx)
			nextCheck = time.Now().Add(d.cfg.CheckInterval)
		}
	}
}

// readAlarms reads etcd's alarms into the status and the metrics, and says
// whether NOSPACE is raised.
func (d *Defragmenter) readAlarms(ctx context.Context) (bool, error) {
	actx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	resp, err := d.Etcd.AlarmList(actx)
	if err != nil {
		return false, fmt.Errorf("list etcd alarms: %w", err)
	}
	count := map[string]float64{etcdserverpb.AlarmType_NOSPACE.String(): 0, etcdserverpb.AlarmType_CORRUPT.String(): 0}
	var names []string
	nospace := false
	for _, a := range resp.Alarms {
		count[a.Alarm.String()]++
		names = append(names, fmt.Sprintf("%s member %x", a.Alarm, a.MemberID))
		nospace = nospace || a.Alarm == etcdserverpb.AlarmType_NOSPACE
	}
	for a, n := range count {
		d.alarmsGauge.WithLabelValues(a).Set(n)
	}
	d.mu.Lock()
	d.alarms = names
	d.mu.Unlock()
	return nospace, nil
}

// defragIfFragmented is the scheduled run.
func (d *Defragmenter) defragIfFragmented(ctx context.Context) {
	failpoint.Hold("before-defrag-check")
	o, err := d.Observe(ctx)
	if err != nil {
		d.Log.Warn("defragmentation check: observe etcd", "err", err)
		return
	}
	p := planDefrag(o, d.cfg, triggerFragmented)
	if p.skip != "" {
		if o.Unhealthy() != "" {
			d.Log.Info("defragmentation check skipped: the cluster is not healthy", "why", p.skip)
		} else {
			var sizes []string
			for _, m := range o.Members {
				sizes = append(sizes, fmt.Sprintf("%x: %d of %d in use", m.ID, m.DBInUse, m.DBSize))
			}
			d.Log.Debug("no defragmentation", "why", p.skip, "sizes", sizes)
		}
		return
	}
	start := time.Now()
	outcome, steps, ok := d.execute(ctx, triggerFragmented, p)
	d.noteRun(triggerFragmented, start, outcome, ok, steps)
}

// recoverNoSpace is the NOSPACE run: compact to the current revision,
// defragment every member, and disarm once every member's database fits
// its quota. It says whether the alarm was disarmed.
func (d *Defragmenter) recoverNoSpace(ctx context.Context) bool {
	failpoint.Hold("before-nospace-recovery")
	d.Log.Warn("etcd NOSPACE alarm raised: compacting, defragmenting, then disarming")
	start := time.Now()
	var steps []string
	step := func(name string, err error) error {
		result := "ok"
		if err != nil {
			result = "failed"
			d.Log.Warn("NOSPACE recovery step failed", "step", name, "err", err)
		} else {
			d.Log.Info("NOSPACE recovery step done", "step", name)
		}
		d.nospaceSteps.WithLabelValues(name, result).Inc()
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, defragCallTimeout)
	rev, err := d.compact(cctx)
	cancel()
	if step("compact", err) != nil {
		d.noteRun(triggerNoSpace, start, "compaction failed: "+err.Error(), false, steps)
		return false
	}
	o, err := d.Observe(ctx)
	if step("observe", err) != nil {
		d.noteRun(triggerNoSpace, start, "observe etcd: "+err.Error(), false, steps)
		return false
	}
	p := planDefrag(o, d.cfg, triggerNoSpace)
	if p.skip != "" {
		d.Log.Warn("NOSPACE: no defragmentation", "why", p.skip)
		d.noteRun(triggerNoSpace, start, fmt.Sprintf("compacted to revision %d; defragmentation skipped: %s", rev, p.skip), false, steps)
		return false
	}
	summary, steps, ok := d.execute(ctx, triggerNoSpace, p)
	if step("defragment", boolErr(ok, summary)) != nil {
		d.noteRun(triggerNoSpace, start, fmt.Sprintf("compacted to revision %d, %s", rev, summary), false, steps)
		return false
	}
	after, err := d.Observe(ctx)
	if err != nil {
		_ = step("disarm", err) // logged and counted
		d.noteRun(triggerNoSpace, start, "observe etcd before the disarm: "+err.Error(), false, steps)
		return false
	}
	for _, m := range after.Members {
		if m.Answered && m.Quota > 0 && m.DBSize >= m.Quota {
			d.Log.Warn("NOSPACE: a database is still over its quota; the alarm stays until data is deleted", "member", fmt.Sprintf("%x", m.ID), "db_size", m.DBSize, "quota", m.Quota)
			d.nospaceSteps.WithLabelValues("disarm", "waiting").Inc()
			d.noteRun(triggerNoSpace, start, fmt.Sprintf("compacted to revision %d, %s; member %x is still %d bytes of its %d quota: delete data", rev, summary, m.ID, m.DBSize, m.Quota), false, steps)
			return false
		}
	}
	var disarmErr error
	for _, a := range after.Alarms {
		if a.Alarm != etcdserverpb.AlarmType_NOSPACE {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, statusTimeout)
		_, err := d.Etcd.AlarmDisarm(dctx, &clientv3.AlarmMember{MemberID: a.MemberID, Alarm: a.Alarm})
		cancel()
		if err != nil {
			disarmErr = errors.Join(disarmErr, fmt.Errorf("disarm NOSPACE of member %x: %w", a.MemberID, err))
		}
	}
	if step("disarm", disarmErr) != nil {
		d.noteRun(triggerNoSpace, start, "disarm failed: "+disarmErr.Error(), false, steps)
		return false
	}
	outcome := fmt.Sprintf("NOSPACE recovered: compacted to revision %d, %s, alarm disarmed", rev, summary)
	d.noteRun(triggerNoSpace, start, outcome, true, steps)
	d.Log.Info("etcd NOSPACE alarm disarmed", "revision", rev)
	if _, err := d.readAlarms(ctx); err != nil {
		d.Log.Warn("read etcd alarms after the disarm", "err", err)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), defragAuditTimeout)
	defer cancel()
	if err := d.audit(actx, auditv1.AuditAction_AUDIT_ACTION_ETCD_NOSPACE_RECOVERED, outcome); err != nil {
		d.Log.Warn("record the NOSPACE recovery in the audit log", "err", err)
	}
	return true
}

func boolErr(ok bool, why string) error {
	if ok {
		return nil
	}
	return errors.New(why)
}

// compact compacts etcd's history to its current revision (physically:
// the call returns once the members freed the pages).
func (d *Defragmenter) compact(ctx context.Context) (int64, error) {
	resp, err := d.Etcd.Get(ctx, keys.MembershipPending, clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("read the current revision: %w", err)
	}
	rev := resp.Header.Revision
	if _, err := d.Etcd.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return 0, fmt.Errorf("compact to revision %d: %w", rev, err)
	}
	return rev, nil
}

// execute defragments the plan's members in its order, each only while
// the cluster is healthy, and returns a summary, the steps it took and
// whether every member was defragmented.
func (d *Defragmenter) execute(ctx context.Context, trigger string, p Plan) (string, []string, bool) {
	var steps []string
	var reclaimed int64
	done := 0
	finish := func(why string, ok bool) (string, []string, bool) {
		outcome := fmt.Sprintf("defragmented %d of %d members, reclaimed %d bytes", done, len(p.order), reclaimed)
		if why != "" {
			outcome += "; stopped: " + why
			d.Log.Warn("defragmentation stopped", "trigger", trigger, "why", why, "defragmented", done, "of", len(p.order))
		}
		return outcome, steps, ok
	}
	order, moveLeader := p.order, p.moveLeader
	if failpoint.Mutated(failpoint.NoDefragOrder) {
		order = slices.Clone(order)
		slices.SortFunc(order, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
		moveLeader = false
	}
	for _, m := range order {
		if _, ok := d.leads(); !ok {
			return finish("this replica no longer leads", false)
		}
		o, err := d.Observe(ctx)
		if err != nil {
			return finish(err.Error(), false)
		}
		if why := o.Unhealthy(); why != "" {
			return finish(why, false)
		}
		leader, _ := o.Leader()
		if m.ID == leader && moveLeader {
			to, err := d.MoveLeader(ctx, o, leader)
			if err != nil {
				d.failures.Inc()
				return finish(err.Error(), false)
			}
			steps = append(steps, fmt.Sprintf("move-leader %x %x", leader, to))
			if o, err = d.Observe(ctx); err != nil {
				return finish(err.Error(), false)
			}
		}
		before := m.DBSize
		for _, cur := range o.Members {
			if cur.ID == m.ID {
				before = cur.DBSize
			}
		}
		after, err := d.defragment(ctx, m)
		if err != nil {
			d.failures.Inc()
			return finish(err.Error(), false)
		}
		done++
		steps = append(steps, fmt.Sprintf("defragment %x", m.ID))
		reclaimed += max(before-after, 0)
		d.reclaimed.Add(float64(max(before-after, 0)))
		d.lastDefrag.WithLabelValues(fmt.Sprintf("%x", m.ID)).Set(float64(time.Now().UnixNano()) / 1e9)
		d.Log.Info("etcd member defragmented", "member", fmt.Sprintf("%x", m.ID), "name", m.Name, "trigger", trigger,
			"db_size_before", before, "db_size_after", after)
	}
	return finish("", true)
}

// defragment defragments one member, bounded by defragCallTimeout, and
// waits until it answers and applied what the etcd leader had committed
// when it was done. It returns the member's db size after.
//
// A member being defragmented serves no read or write until it is done:
// its clients (this curator's among them, when it is one of the client's
// endpoints) wait for it. That is why members go one at a time, and only
// while every other voter answers.
func (d *Defragmenter) defragment(ctx context.Context, m Member) (int64, error) {
	dctx, cancel := context.WithTimeout(ctx, defragCallTimeout)
	_, err := d.Member.Defragment(dctx, m.Endpoint)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("defragment etcd member %x (%s): %w", m.ID, m.Endpoint, err)
	}
	wctx, cancel := context.WithTimeout(ctx, catchUpTimeout)
	defer cancel()
	var target uint64
	var size int64
	err = d.until(wctx, func(o Observation) bool {
		leader, _ := o.Leader()
		for _, cur := range o.Members {
			if cur.ID == leader && target == 0 {
				target = cur.RaftIndex
			}
		}
		for _, cur := range o.Members {
			if cur.ID == m.ID && cur.Answered && target != 0 && cur.AppliedIndex >= target {
				size = cur.DBSize
				return true
			}
		}
		return false
	})
	if err != nil {
		return 0, fmt.Errorf("etcd member %x after its defragmentation: %w", m.ID, err)
	}
	return size, nil
}

// noteRun records how a run ended, for the status.
func (d *Defragmenter) noteRun(trigger string, start time.Time, outcome string, ok bool, steps []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lastRun = &curatorv1.EtcdMaintenanceStatus{
		LastRunTrigger: trigger, LastRunStart: timestamppb.New(start), LastRunEnd: timestamppb.Now(),
		LastRunOutcome: outcome, LastRunOk: ok, LastRunSteps: steps,
	}
}

// Status is the etcd maintenance part of GetClusterInfo.
func (d *Defragmenter) Status() *curatorv1.EtcdMaintenanceStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := &curatorv1.EtcdMaintenanceStatus{}
	if d.lastRun != nil {
		st = cloneRun(d.lastRun)
	}
	st.DefragCheckInterval = durationpb.New(d.cfg.CheckInterval)
	st.Alarms = slices.Clone(d.alarms)
	return st
}

func cloneRun(r *curatorv1.EtcdMaintenanceStatus) *curatorv1.EtcdMaintenanceStatus {
	return &curatorv1.EtcdMaintenanceStatus{
		LastRunTrigger: r.LastRunTrigger, LastRunStart: r.LastRunStart, LastRunEnd: r.LastRunEnd,
		LastRunOutcome: r.LastRunOutcome, LastRunOk: r.LastRunOk, LastRunSteps: slices.Clone(r.LastRunSteps),
	}
}

// Metrics are the defragmentation's metrics.
func (d *Defragmenter) Metrics() []prometheus.Collector {
	return []prometheus.Collector{d.alarmsGauge, d.lastDefrag, d.reclaimed, d.failures, d.nospaceSteps}
}
