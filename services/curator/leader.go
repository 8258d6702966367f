package curator

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
	"curia.dev/platform/run"
	"curia.dev/services/curator/internal/leases"
	"curia.dev/services/curator/internal/nodewatch"
)

// electionPrefix is the election's prefix without the trailing slash that
// concurrency.Election adds itself.
var electionPrefix = strings.TrimSuffix(keys.LeaderElection, "/")

// leaderValue is what a candidate writes into its election key.
type leaderValue struct {
	Name    string `json:"name"`
	Address string `json:"address"`
}

// leaderInfo is who leads, as this replica knows it.
type leaderInfo struct {
	leaderValue
	// Term is the create revision of the leader's election key.
	Term  int64
	Since time.Time
}

// leadership tracks this replica's role in the election and who leads.
type leadership struct {
	etcd *clientv3.Client
	// sessionEtcd holds the election session: a client of its own, so
	// that the renewal of the session's lease never queues behind the
	// serving client's calls (at 10,000 agents it did, and the leader was
	// deposed). Term-guarded writes use etcd.
	sessionEtcd *clientv3.Client
	log         *slog.Logger
	// self is what this replica writes into its election key.
	self       leaderValue
	sessionTTL time.Duration
	// onLead runs when this replica wins, before it serves as leader.
	onLead func(ctx context.Context, term int64)

	mu sync.Mutex
	// Our own leadership: key and term while we lead, else empty.
	key     string
	term    int64
	session *concurrency.Session
	// The leader as observed (maybe us), and a channel closed on change.
	current leaderInfo
	changed chan struct{}

	// conns are the connections to the other replicas (forwarding).
	conns *rpc.Conns
}

func newLeadership(etcd, sessionEtcd *clientv3.Client, creds *rpc.Credentials, log *slog.Logger, self leaderValue, sessionTTL time.Duration, onLead func(context.Context, int64)) *leadership {
	return &leadership{
		etcd: etcd, sessionEtcd: sessionEtcd, log: log, self: self, sessionTTL: sessionTTL, onLead: onLead,
		changed: make(chan struct{}), conns: rpc.NewConns(rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}}),
	}
}

// campaign runs for leader until ctx ends: it wins, leads until its session
// dies, and campaigns again. On ctx's end a leader resigns before returning.
// It calls ready once it holds a session (it reached etcd and campaigns).
func (l *leadership) campaign(ctx context.Context, ready func()) error {
	ttl := int(l.sessionTTL / time.Second)
	val, _ := json.Marshal(l.self)
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(l.sessionEtcd, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
		if err != nil {
			l.log.Warn("election session", "err", err)
			run.Sleep(ctx, time.Second)
			continue
		}
		ready()
		el := concurrency.NewElection(sess, electionPrefix)
		if err := el.Campaign(ctx, string(val)); err != nil {
			orphan(sess)
			if ctx.Err() == nil {
				l.log.Warn("campaign", "err", err)
				run.Sleep(ctx, time.Second)
			}
			continue
		}
		l.mu.Lock()
		l.key, l.term, l.session = el.Key(), el.Rev(), sess
		l.mu.Unlock()
		l.log.Info("leading", "term", el.Rev(), "key", el.Key())
		l.onLead(ctx, el.Rev())

		select {
		case <-ctx.Done():
			// SIGTERM: hand over at once instead of making followers wait
			// for the session TTL.
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := el.Resign(rctx); err != nil {
				l.log.Warn("resign", "err", err)
			}
			cancel()
			l.stepDown("shutting down")
			orphan(sess)
			return nil
		case <-sess.Done():
			l.stepDown("election session ended")
		}
	}
	return nil
}

// orphan drops a session without waiting for etcd (Close waits up to the
// TTL when etcd is away); its lease expires on its own.
func orphan(s *concurrency.Session) {
	s.Orphan()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = s.Client().Revoke(ctx, s.Lease()) // best effort: the lease expires anyway
}

func (l *leadership) stepDown(why string) {
	l.mu.Lock()
	term := l.term
	l.key, l.term, l.session = "", 0, nil
	l.mu.Unlock()
	if term != 0 {
		l.log.Warn("stepped down", "term", term, "why", why)
	}
}

// Lost is called when a term-guarded write found the term gone: stop
// acting as leader at once and campaign again.
func (l *leadership) Lost() {
	l.mu.Lock()
	sess := l.session
	l.mu.Unlock()
	if sess != nil {
		orphan(sess)
	}
}

// Ours returns the leader key and term while this replica leads (exported,
// with Txn, for the internal packages: leases.Leadership).
func (l *leadership) Ours() (key string, term int64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.key, l.term, l.term != 0
}

// Fence is the leader's fence: [leader key @ term] (exported for
// internal/auditlog).
func (l *leadership) Fence() (fence.Fence, error) {
	key, term, ok := l.Ours()
	if !ok {
		return fence.Fence{}, errNotLeader
	}
	return fence.Fence{Conditions: []fence.Condition{{Key: key, CreateRevision: term}}}, nil
}

// observe follows the election: who leads and since when. It calls ready
// once it knows a leader.
func (l *leadership) observe(ctx context.Context, ready func()) error {
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(l.etcd, concurrency.WithTTL(int(l.sessionTTL/time.Second)), concurrency.WithContext(ctx))
		if err != nil {
			run.Sleep(ctx, time.Second)
			continue
		}
		el := concurrency.NewElection(sess, electionPrefix)
		for resp := range el.Observe(ctx) {
			if len(resp.Kvs) == 0 {
				continue
			}
			var v leaderValue
			if err := json.Unmarshal(resp.Kvs[0].Value, &v); err != nil {
				l.log.Warn("unreadable election value", "key", string(resp.Kvs[0].Key), "err", err)
				continue
			}
			l.setCurrent(leaderInfo{leaderValue: v, Term: resp.Kvs[0].CreateRevision, Since: time.Now()})
			ready()
		}
		orphan(sess)
		run.Sleep(ctx, 100*time.Millisecond)
	}
	return nil
}

func (l *leadership) setCurrent(info leaderInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.current.Term == info.Term && l.current.Name == info.Name {
		return
	}
	l.current = info
	close(l.changed)
	l.changed = make(chan struct{})
	l.log.Info("leader observed", "leader", info.Name, "address", info.Address, "term", info.Term)
}

// leader returns the observed leader and a channel closed when it changes.
func (l *leadership) leader() (leaderInfo, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.current, l.changed
}

// Txn runs ops in a transaction guarded by this replica's term, plus cmps.
// A lost term is errNotLeader (and ends our leadership); failed cmps are
// errConflict. The caller decides what a conflict means.
func (l *leadership) Txn(ctx context.Context, cmps []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	key, term, ok := l.Ours()
	if !ok {
		return nil, errNotLeader
	}
	guards := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", term)}
	if failpoint.Mutated(failpoint.NoTermGuard) {
		guards = nil
	}
	resp, err := l.etcd.Txn(ctx).
		If(append(guards, cmps...)...).
		Then(ops...).
		Else(clientv3.OpGet(key, clientv3.WithKeysOnly())).
		Commit()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("etcd txn: %w", ctx.Err())
		}
		// etcd did not answer (a member stopping, no quorum): worth a retry.
		return nil, fmt.Errorf("%w: etcd txn: %v", errUnavailable, err)
	}
	if resp.Succeeded {
		return resp, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != term {
		l.log.Warn("term lost during a write", "term", term)
		l.Lost()
		return nil, errNotLeader
	}
	return nil, errConflict
}

// conn returns a cached connection to another replica.
func (l *leadership) conn(addr string) (*grpc.ClientConn, error) { return l.conns.Get(addr) }

func (l *leadership) closeConns() { l.conns.Close() }

var errNoLeader = rpcerr.NotLeader.Sub("no curator leader is elected yet; retry shortly")

// shortRetry is the RetryInfo of a refusal that ends by itself within a
// second or so (no leader elected yet, the cluster not bootstrapped yet),
// so that callers do not back off for many seconds at a cold start.
const shortRetry = 250 * time.Millisecond

// becameLeader prepares what a leader needs: the nodes' heartbeats, the
// register ticket, and no lease of an earlier term.
func (s *Service) becameLeader(ctx context.Context, term int64) {
	for {
		err := s.beatsLead(ctx, term)
		if err == nil {
			break
		}
		if _, cur, ok := s.lead.Ours(); ctx.Err() != nil || !ok || cur != term {
			return
		}
		s.log.Warn("load the heartbeats", "term", term, "err", err)
		run.Sleep(ctx, nodewatch.Retry)
	}
	if err := leases.DropOldTerm(ctx, s.etcd, s.lead, s.log, term); err != nil {
		s.log.Warn("drop old-term leases", "term", term, "err", err)
	}
	if err := s.certs.ResignCRL(ctx); err != nil {
		s.log.Warn("sign the CRL with this curator's CA", "term", term, "err", err)
	}
	ticket := make([]byte, 24)
	rand.Read(ticket)
	_, err := s.lead.Txn(ctx,
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(keys.RegisterTicket), "=", 0)},
		clientv3.OpPut(keys.RegisterTicket, string(ticket)))
	if err != nil && !errors.Is(err, errConflict) {
		s.log.Warn("create register ticket", "term", term, "err", err)
	}
}

// GetCurrentLeader streams who leads, and a new answer whenever that
// changes; any replica answers from what it observes of the election.
func (x *curatorServer) GetCurrentLeader(_ *curatorv1.GetCurrentLeaderRequest, stream curatorv1.Curator_GetCurrentLeaderServer) error {
	s := x.s
	for {
		cur, changed := s.lead.leader()
		_, _, ours := s.lead.Ours()
		resp := &curatorv1.GetCurrentLeaderResponse{
			LeaderName:    cur.Name,
			LeaderAddress: cur.Address,
			Term:          cur.Term,
			ThisName:      s.cfg.Name,
			ThisIsLeader:  ours && cur.Name == s.cfg.Name,
		}
		if !cur.Since.IsZero() {
			resp.Since = timestamppb.New(cur.Since)
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}
