package curator

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
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
// Both runs observe (observeEtcd: every member's status, the alarms, the
// pending membership change record), plan (planDefrag, pure) and apply
// (defragment): followers first, the etcd leader last, after its
// leadership moved to a caught-up voter (MoveLeader), each member answering
// and caught up again before the next. Healthy means every voter answers
// its status, they agree on a leader, and no membership change is pending
// (keys.MembershipPending, as the consensus service writes it); it never
// asks for a write, which NOSPACE refuses.

// DefragConfig configures the leader's defragmentation.
type DefragConfig struct {
	// CheckInterval is how often the leader looks whether defragmentation
	// pays; 0: never on a schedule (NOSPACE is still handled).
	CheckInterval time.Duration
	// Threshold is the fragmentation, (db size − in use) / db size, past
	// which a member is defragmented, when it also wastes MinWasted.
	Threshold float64
	MinWasted int64
}

// AddFlags registers the defragmentation flags.
func (c *DefragConfig) AddFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.CheckInterval, "defrag-check-interval", c.CheckInterval, "how often the leader looks whether defragmenting etcd's members pays (0: never on a schedule; NOSPACE is still handled)")
	fs.Float64Var(&c.Threshold, "defrag-threshold", c.Threshold, "a member is defragmented when this share of its database is free pages ((db size - in use) / db size) ...")
	fs.Int64Var(&c.MinWasted, "defrag-min-wasted-bytes", c.MinWasted, "... and those free pages are at least this many bytes (small databases are left alone)")
}

// Validate checks the defragmentation flags.
func (c *DefragConfig) Validate() error {
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
	// defragStatusTimeout bounds each member's status call.
	defragStatusTimeout = 2 * time.Second
	// defragCallTimeout bounds one member's defragmentation: it rewrites
	// the member's whole database, during which that member serves no
	// read or write (its clients wait, or go to other members).
	defragCallTimeout = 5 * time.Minute
	// defragCatchUpTimeout bounds the wait for a defragmented member to
	// answer and apply what the etcd leader committed meanwhile, and for a
	// leadership move to show.
	defragCatchUpTimeout = 30 * time.Second
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

// etcdMember is one member as a run observed it.
type etcdMember struct {
	id       uint64
	name     string
	endpoint string // its first client URL
	learner  bool
	// answered: its status came back; the rest is that status.
	answered     bool
	leaderID     uint64 // the etcd leader it names
	dbSize       int64
	dbInUse      int64
	quota        int64
	raftIndex    uint64 // committed
	appliedIndex uint64
}

func (m etcdMember) wasted() int64 { return m.dbSize - m.dbInUse }

func (m etcdMember) fragmentation() float64 {
	if m.dbSize <= 0 {
		return 0
	}
	return float64(m.wasted()) / float64(m.dbSize)
}

// etcdObservation is what a run plans from.
type etcdObservation struct {
	members []etcdMember
	// pending: a membership change record exists.
	pending bool
	alarms  []*etcdserverpb.AlarmMember
}

// leader is the etcd leader the members agree on (0: none, or they
// disagree), and why not when there is none.
func (o etcdObservation) leader() (uint64, string) {
	var leader uint64
	for _, m := range o.members {
		if !m.answered {
			continue
		}
		if m.leaderID == 0 {
			return 0, fmt.Sprintf("member %x knows no leader", m.id)
		}
		if leader != 0 && m.leaderID != leader {
			return 0, fmt.Sprintf("members name different leaders (%x, %x)", leader, m.leaderID)
		}
		leader = m.leaderID
	}
	if leader == 0 {
		return 0, "no member answered"
	}
	return leader, ""
}

// unhealthy says why the cluster is not healthy enough to defragment a
// member ("" when it is): a voter does not answer, there is no leader, or
// a membership change is pending.
func (o etcdObservation) unhealthy() string {
	if o.pending {
		return "a membership change is pending"
	}
	for _, m := range o.members {
		if !m.learner && !m.answered {
			return fmt.Sprintf("voter %x (%s) does not answer", m.id, m.name)
		}
	}
	_, why := o.leader()
	return why
}

// defragPlan is what a run does.
type defragPlan struct {
	// skip says why nothing is done ("" when something is).
	skip string
	// order is the members to defragment, in order: followers first, the
	// etcd leader last (its leadership moved first: moveLeader).
	order      []etcdMember
	moveLeader bool
}

// planDefrag chooses the members to defragment: on NOSPACE every member
// that answers, else those past the threshold and the floor; followers
// (learners among them) first, by most wasted, then the etcd leader. Nothing
// while the cluster is unhealthy.
func planDefrag(o etcdObservation, cfg DefragConfig, trigger string) defragPlan {
	if why := o.unhealthy(); why != "" {
		return defragPlan{skip: why}
	}
	leader, _ := o.leader()
	var followers []etcdMember
	var last *etcdMember
	for _, m := range o.members {
		if !m.answered {
			continue // a learner that does not answer
		}
		if trigger != triggerNoSpace && (m.fragmentation() < cfg.Threshold || m.wasted() < cfg.MinWasted) {
			continue
		}
		if m.id == leader {
			last = &m
			continue
		}
		followers = append(followers, m)
	}
	slices.SortStableFunc(followers, func(a, b etcdMember) int { return cmp.Compare(b.wasted(), a.wasted()) })
	p := defragPlan{order: followers}
	if last != nil {
		p.order = append(p.order, *last)
		p.moveLeader = true
	}
	if len(p.order) == 0 {
		p.skip = "no member is fragmented enough"
	}
	return p
}

// defragmenter runs the leader's defragmentation and watches the alarms.
type defragmenter struct {
	s   *Service
	cfg DefragConfig
	log *slog.Logger

	alarmsGauge  *prometheus.GaugeVec
	lastDefrag   *prometheus.GaugeVec
	reclaimed    prometheus.Counter
	failures     prometheus.Counter
	nospaceSteps *prometheus.CounterVec

	mu      sync.Mutex
	alarms  []string
	lastRun *curatorv1.EtcdMaintenanceStatus // the last run's fields only
}

func newDefragmenter(s *Service, cfg DefragConfig, log *slog.Logger) *defragmenter {
	return &defragmenter{
		s: s, cfg: cfg, log: log,
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

// run is the schedule, on every replica; it acts while this replica leads.
func (d *defragmenter) run(ctx context.Context) error {
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
		_, cur, leads := d.s.lead.ours()
		if !leads {
			term = 0
			continue
		}
		if cur != term {
			term, nextCheck, nospaceAt = cur, time.Now().Add(d.cfg.CheckInterval), time.Time{}
		}
		nospace, err := d.readAlarms(ctx)
		if err != nil {
			d.log.Debug("read etcd alarms", "err", err)
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
func (d *defragmenter) readAlarms(ctx context.Context) (bool, error) {
	actx, cancel := context.WithTimeout(ctx, defragStatusTimeout)
	defer cancel()
	resp, err := d.s.etcd.AlarmList(actx)
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

// observeEtcd reads every member's status, the pending membership change
// record and the alarms.
func (d *defragmenter) observeEtcd(ctx context.Context) (etcdObservation, error) {
	lctx, cancel := context.WithTimeout(ctx, defragStatusTimeout)
	defer cancel()
	list, err := d.s.etcd.MemberList(lctx)
	if err != nil {
		return etcdObservation{}, fmt.Errorf("list etcd members: %w", err)
	}
	pending, err := d.s.etcd.Get(lctx, keys.MembershipPending, clientv3.WithCountOnly())
	if err != nil {
		return etcdObservation{}, fmt.Errorf("read the pending membership change: %w", err)
	}
	alarms, err := d.s.etcd.AlarmList(lctx)
	if err != nil {
		return etcdObservation{}, fmt.Errorf("list etcd alarms: %w", err)
	}
	o := etcdObservation{pending: pending.Count > 0, alarms: alarms.Alarms, members: make([]etcdMember, len(list.Members))}
	var wg sync.WaitGroup
	for i, lm := range list.Members {
		o.members[i] = etcdMember{id: lm.ID, name: lm.Name, learner: lm.IsLearner}
		if len(lm.ClientURLs) > 0 {
			o.members[i].endpoint = lm.ClientURLs[0]
			wg.Go(func() { d.memberStatus(ctx, &o.members[i]) })
		}
	}
	wg.Wait()
	return o, nil
}

// memberStatus fills in m's status, if it answers.
func (d *defragmenter) memberStatus(ctx context.Context, m *etcdMember) {
	sctx, cancel := context.WithTimeout(ctx, defragStatusTimeout)
	defer cancel()
	st, err := d.s.memberEtcd.Status(sctx, m.endpoint)
	if err != nil {
		m.answered = false
		return
	}
	m.answered, m.leaderID = true, st.Leader
	m.dbSize, m.dbInUse, m.quota = st.DbSize, st.DbSizeInUse, st.DbSizeQuota
	m.raftIndex, m.appliedIndex = st.RaftIndex, st.RaftAppliedIndex
}

// defragIfFragmented is the scheduled run.
func (d *defragmenter) defragIfFragmented(ctx context.Context) {
	failpoint.Hold("before-defrag-check")
	o, err := d.observeEtcd(ctx)
	if err != nil {
		d.log.Warn("defragmentation check: observe etcd", "err", err)
		return
	}
	p := planDefrag(o, d.cfg, triggerFragmented)
	if p.skip != "" {
		if o.unhealthy() != "" {
			d.log.Info("defragmentation check skipped: the cluster is not healthy", "why", p.skip)
		} else {
			var sizes []string
			for _, m := range o.members {
				sizes = append(sizes, fmt.Sprintf("%x: %d of %d in use", m.id, m.dbInUse, m.dbSize))
			}
			d.log.Debug("no defragmentation", "why", p.skip, "sizes", sizes)
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
func (d *defragmenter) recoverNoSpace(ctx context.Context) bool {
	failpoint.Hold("before-nospace-recovery")
	d.log.Warn("etcd NOSPACE alarm raised: compacting, defragmenting, then disarming")
	start := time.Now()
	var steps []string
	step := func(name string, err error) error {
		result := "ok"
		if err != nil {
			result = "failed"
			d.log.Warn("NOSPACE recovery step failed", "step", name, "err", err)
		} else {
			d.log.Info("NOSPACE recovery step done", "step", name)
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
	o, err := d.observeEtcd(ctx)
	if step("observe", err) != nil {
		d.noteRun(triggerNoSpace, start, "observe etcd: "+err.Error(), false, steps)
		return false
	}
	p := planDefrag(o, d.cfg, triggerNoSpace)
	if p.skip != "" {
		d.log.Warn("NOSPACE: no defragmentation", "why", p.skip)
		d.noteRun(triggerNoSpace, start, fmt.Sprintf("compacted to revision %d; defragmentation skipped: %s", rev, p.skip), false, steps)
		return false
	}
	summary, steps, ok := d.execute(ctx, triggerNoSpace, p)
	if step("defragment", boolErr(ok, summary)) != nil {
		d.noteRun(triggerNoSpace, start, fmt.Sprintf("compacted to revision %d, %s", rev, summary), false, steps)
		return false
	}
	after, err := d.observeEtcd(ctx)
	if err != nil {
		_ = step("disarm", err) // logged and counted
		d.noteRun(triggerNoSpace, start, "observe etcd before the disarm: "+err.Error(), false, steps)
		return false
	}
	for _, m := range after.members {
		if m.answered && m.quota > 0 && m.dbSize >= m.quota {
			d.log.Warn("NOSPACE: a database is still over its quota; the alarm stays until data is deleted", "member", fmt.Sprintf("%x", m.id), "db_size", m.dbSize, "quota", m.quota)
			d.nospaceSteps.WithLabelValues("disarm", "waiting").Inc()
			d.noteRun(triggerNoSpace, start, fmt.Sprintf("compacted to revision %d, %s; member %x is still %d bytes of its %d quota: delete data", rev, summary, m.id, m.dbSize, m.quota), false, steps)
			return false
		}
	}
	var disarmErr error
	for _, a := range after.alarms {
		if a.Alarm != etcdserverpb.AlarmType_NOSPACE {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, defragStatusTimeout)
		_, err := d.s.etcd.AlarmDisarm(dctx, &clientv3.AlarmMember{MemberID: a.MemberID, Alarm: a.Alarm})
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
	d.log.Info("etcd NOSPACE alarm disarmed", "revision", rev)
	if _, err := d.readAlarms(ctx); err != nil {
		d.log.Warn("read etcd alarms after the disarm", "err", err)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), defragAuditTimeout)
	defer cancel()
	if _, err := d.s.lead.txn(actx, nil, d.s.auditOp(actx, auditv1.AuditAction_AUDIT_ACTION_ETCD_NOSPACE_RECOVERED, "", truncate(outcome, 2048))); err != nil {
		d.log.Warn("record the NOSPACE recovery in the audit log", "err", err)
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
func (d *defragmenter) compact(ctx context.Context) (int64, error) {
	resp, err := d.s.etcd.Get(ctx, keys.MembershipPending, clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("read the current revision: %w", err)
	}
	rev := resp.Header.Revision
	if _, err := d.s.etcd.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return 0, fmt.Errorf("compact to revision %d: %w", rev, err)
	}
	return rev, nil
}

// execute defragments the plan's members in its order, each only while
// the cluster is healthy, and returns a summary, the steps it took and
// whether every member was defragmented.
func (d *defragmenter) execute(ctx context.Context, trigger string, p defragPlan) (string, []string, bool) {
	var steps []string
	var reclaimed int64
	done := 0
	finish := func(why string, ok bool) (string, []string, bool) {
		outcome := fmt.Sprintf("defragmented %d of %d members, reclaimed %d bytes", done, len(p.order), reclaimed)
		if why != "" {
			outcome += "; stopped: " + why
			d.log.Warn("defragmentation stopped", "trigger", trigger, "why", why, "defragmented", done, "of", len(p.order))
		}
		return outcome, steps, ok
	}
	order, moveLeader := p.order, p.moveLeader
	if failpoint.Mutated(failpoint.NoDefragOrder) {
		order = slices.Clone(order)
		slices.SortFunc(order, func(a, b etcdMember) int { return cmp.Compare(a.id, b.id) })
		moveLeader = false
	}
	for _, m := range order {
		if _, _, ok := d.s.lead.ours(); !ok {
			return finish("this replica no longer leads", false)
		}
		o, err := d.observeEtcd(ctx)
		if err != nil {
			return finish(err.Error(), false)
		}
		if why := o.unhealthy(); why != "" {
			return finish(why, false)
		}
		leader, _ := o.leader()
		if m.id == leader && moveLeader {
			to, err := d.moveLeader(ctx, o, leader)
			if err != nil {
				d.failures.Inc()
				return finish(err.Error(), false)
			}
			steps = append(steps, fmt.Sprintf("move-leader %x %x", leader, to))
			if o, err = d.observeEtcd(ctx); err != nil {
				return finish(err.Error(), false)
			}
		}
		before := m.dbSize
		for _, cur := range o.members {
			if cur.id == m.id {
				before = cur.dbSize
			}
		}
		after, err := d.defragment(ctx, m)
		if err != nil {
			d.failures.Inc()
			return finish(err.Error(), false)
		}
		done++
		steps = append(steps, fmt.Sprintf("defragment %x", m.id))
		reclaimed += max(before-after, 0)
		d.reclaimed.Add(float64(max(before-after, 0)))
		d.lastDefrag.WithLabelValues(fmt.Sprintf("%x", m.id)).Set(float64(time.Now().UnixNano()) / 1e9)
		d.log.Info("etcd member defragmented", "member", fmt.Sprintf("%x", m.id), "name", m.name, "trigger", trigger,
			"db_size_before", before, "db_size_after", after)
	}
	return finish("", true)
}

// moveLeader moves etcd's leadership from leader to the caught-up voter
// (moveLeaderMaxLag) that applied the most, and waits until the members
// follow it.
func (d *defragmenter) moveLeader(ctx context.Context, o etcdObservation, leader uint64) (uint64, error) {
	var from etcdMember
	for _, m := range o.members {
		if m.id == leader {
			from = m
		}
	}
	var to *etcdMember
	for _, m := range o.members {
		if m.id == leader || m.learner || !m.answered || m.appliedIndex+moveLeaderMaxLag < from.appliedIndex {
			continue
		}
		if to == nil || m.appliedIndex > to.appliedIndex {
			to = &m
		}
	}
	if to == nil {
		return 0, fmt.Errorf("no caught-up voter to move etcd leadership to from %x", leader)
	}
	cc, err := d.s.memberEtcd.Dial(from.endpoint)
	if err != nil {
		return 0, fmt.Errorf("dial etcd leader %x: %w", leader, err)
	}
	defer cc.Close()
	mctx, cancel := context.WithTimeout(ctx, defragCatchUpTimeout)
	defer cancel()
	if _, err := etcdserverpb.NewMaintenanceClient(cc).MoveLeader(mctx, &etcdserverpb.MoveLeaderRequest{TargetID: to.id}); err != nil {
		return 0, fmt.Errorf("move etcd leadership from %x to %x: %w", leader, to.id, err)
	}
	d.log.Info("etcd leadership moved before defragmenting the leader", "from", fmt.Sprintf("%x", leader), "to", fmt.Sprintf("%x", to.id))
	return to.id, d.until(mctx, func(o etcdObservation) bool {
		l, _ := o.leader()
		return l != 0 && l != leader && o.unhealthy() == ""
	})
}

// defragment defragments one member, bounded by defragCallTimeout, and
// waits until it answers and applied what the etcd leader had committed
// when it was done. It returns the member's db size after.
//
// A member being defragmented serves no read or write until it is done:
// its clients (this curator's among them, when it is one of the client's
// endpoints) wait for it. That is why members go one at a time, and only
// while every other voter answers.
func (d *defragmenter) defragment(ctx context.Context, m etcdMember) (int64, error) {
	dctx, cancel := context.WithTimeout(ctx, defragCallTimeout)
	_, err := d.s.memberEtcd.Defragment(dctx, m.endpoint)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("defragment etcd member %x (%s): %w", m.id, m.endpoint, err)
	}
	wctx, cancel := context.WithTimeout(ctx, defragCatchUpTimeout)
	defer cancel()
	var target uint64
	var size int64
	err = d.until(wctx, func(o etcdObservation) bool {
		leader, _ := o.leader()
		for _, cur := range o.members {
			if cur.id == leader && target == 0 {
				target = cur.raftIndex
			}
		}
		for _, cur := range o.members {
			if cur.id == m.id && cur.answered && target != 0 && cur.appliedIndex >= target {
				size = cur.dbSize
				return true
			}
		}
		return false
	})
	if err != nil {
		return 0, fmt.Errorf("etcd member %x after its defragmentation: %w", m.id, err)
	}
	return size, nil
}

// until observes etcd until cond holds or ctx ends.
func (d *defragmenter) until(ctx context.Context, cond func(etcdObservation) bool) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		o, err := d.observeEtcd(ctx)
		if err == nil && cond(o) {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("not within %v: %w (last: %w)", defragCatchUpTimeout, ctx.Err(), err)
			}
			return fmt.Errorf("not within %v: %w", defragCatchUpTimeout, ctx.Err())
		case <-t.C:
		}
	}
}

// noteRun records how a run ended, for the status.
func (d *defragmenter) noteRun(trigger string, start time.Time, outcome string, ok bool, steps []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lastRun = &curatorv1.EtcdMaintenanceStatus{
		LastRunTrigger: trigger, LastRunStart: timestamppb.New(start), LastRunEnd: timestamppb.Now(),
		LastRunOutcome: outcome, LastRunOk: ok, LastRunSteps: steps,
	}
}

// status is the etcd maintenance part of GetClusterInfo.
func (d *defragmenter) status() *curatorv1.EtcdMaintenanceStatus {
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

// metrics are the defragmentation's metrics.
func (d *defragmenter) metrics() []prometheus.Collector {
	return []prometheus.Collector{d.alarmsGauge, d.lastDefrag, d.reclaimed, d.failures, d.nospaceSteps}
}
