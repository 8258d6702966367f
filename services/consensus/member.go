package consensus

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/crl"
	"curia.dev/platform/etcdpin"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/logging"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// member owns the embedded etcd member of this node and its data directory.
// It moves through the lifecycle idle → starting → running → stopped (and
// failed), and hands out a client to the cluster's voters while running.
//
// Data directory layout:
//
//	<data-dir>/etcd/         etcd's own data (wal, snap); exists iff this node has a member
//	<data-dir>/state.json    what we know about that member (id, voters' client URLs)
//	<data-dir>/crl.der       the newest revocation list known (DER, as etcd reads it on every new
//	                         connection to its ports); kept across Leave: it is the cluster's, not the member's
//	<data-dir>/identity.key, consensus.crt, member.crt   this process's key and certificates (identity.go)
type member struct {
	cfg Config
	id  *identity
	log *slog.Logger
	zap *zap.Logger
	// crl is the newest revocation list known; crlFileMu serialises the
	// writes of its file.
	crl       *crl.Watcher
	crlFileMu sync.Mutex
	// peerSocket is where etcd serves its peer API, for the peer gate;
	// peerSocketDir, if not empty, is a temporary directory it is in.
	peerSocket, peerSocketDir string

	// changes serialises membership changes made through this process (a
	// one-slot semaphore, so that waiting honours the caller's context).
	// Across processes, the pending change record in etcd does (pending.go).
	changes chan struct{}
	// lifeMu serialises Start, Leave and the restart from disk.
	lifeMu sync.Mutex

	mu     sync.Mutex
	state  consensusv1.LifecycleState
	reason string
	etcd   *embed.Etcd
	client *clientv3.Client
	// done is closed when the current etcd instance stopped and the state
	// says why.
	done chan struct{}
	// stopping is set while stop() stops etcd on purpose.
	stopping bool
	kept     persisted
	// ranOnce is closed the first time etcd serves (state RUNNING).
	ranOnce      chan struct{}
	ranOnceClose sync.Once
}

// persisted is what a member remembers about itself across restarts, so that
// Leave can ask the rest of the cluster even when the local etcd is gone.
type persisted struct {
	MemberID  uint64   `json:"member_id,omitempty"`
	ClusterID uint64   `json:"cluster_id,omitempty"`
	Endpoints []string `json:"endpoints,omitempty"`
	// Removed: the local etcd learned from the cluster that member
	// MemberID was removed. etcd never lets a removed id back, so this is
	// proof enough for Leave, also once the member's certificate (revoked
	// with the role) no longer lets it ask the cluster.
	Removed bool `json:"removed,omitempty"`
}

// newMember prepares the member; etcdLog is the logger etcd's own lines go
// to (the process's, so its format and level).
func newMember(cfg Config, revocations *crl.Watcher, log, etcdLog *slog.Logger) (*member, error) {
	m := &member{cfg: cfg, crl: revocations, log: log, zap: logging.Zap(etcdLog, cfg.etcdLevel()), changes: make(chan struct{}, 1), ranOnce: make(chan struct{})}
	m.state = consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE
	var err error
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	if err := m.loadCRL(); err != nil {
		return nil, err
	}
	if m.peerSocket, m.peerSocketDir, err = peerSocket(cfg.DataDir); err != nil {
		return nil, err
	}
	if m.id, err = loadIdentity(cfg, revocations, log); err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(m.statePath()); err == nil {
		if err := json.Unmarshal(b, &m.kept); err != nil {
			return nil, fmt.Errorf("read %s: %w", m.statePath(), err)
		}
	}
	// A recovery interrupted between its restore and its start.
	if kept, err := m.finishRecoveryOnDisk(); err != nil {
		return nil, fmt.Errorf("finish the interrupted recovery: %w", err)
	} else if kept != "" {
		log.Warn("finished an interrupted recovery: the recovered data is in place", "old_data", kept)
	}
	return m, nil
}

func (m *member) etcdDir() string   { return filepath.Join(m.cfg.DataDir, "etcd") }
func (m *member) statePath() string { return filepath.Join(m.cfg.DataDir, "state.json") }
func (m *member) crlPath() string   { return filepath.Join(m.cfg.DataDir, "crl.der") }

// hasData reports whether this node holds an etcd member on disk.
func (m *member) hasData() bool {
	_, err := os.Stat(filepath.Join(m.etcdDir(), "member", "wal"))
	return err == nil
}

func (m *member) save() error {
	b, err := json.MarshalIndent(m.kept, "", "  ")
	if err != nil {
		return err
	}
	// Written, synced, renamed and the directory synced: after a power
	// loss the state is the old one or the new one, never empty.
	if err := pki.WriteFileAtomic(m.statePath(), b, 0o600); err != nil {
		return fmt.Errorf("member state: %w", err)
	}
	return nil
}

// startMode says how etcd is started.
type startMode int

const (
	modeRestart startMode = iota
	modeBootstrap
	modeJoin
)

func (s startMode) String() string {
	return [...]string{"restart", "bootstrap", "join"}[s]
}

// start starts etcd and waits until it serves or ctx ends; when ctx ends
// first, etcd goes on starting and Status reports it. It is called with no
// etcd running; the caller checked the preconditions.
func (m *member) start(ctx context.Context, mode startMode, initialCluster string) error {
	ec, err := m.etcdConfig(mode, initialCluster)
	if err != nil {
		m.setState(consensusv1.LifecycleState_LIFECYCLE_STATE_FAILED, err.Error())
		return err
	}
	m.setState(consensusv1.LifecycleState_LIFECYCLE_STATE_STARTING, "etcd is starting ("+mode.String()+")")
	m.log.Info("starting etcd", "mode", mode.String(), "peer_url", m.cfg.AdvertisePeerURL, "client_url", m.cfg.AdvertiseClientURL)
	begun := time.Now()

	e, err := embed.StartEtcd(ec)
	if err != nil {
		err = fmt.Errorf("start etcd (%s): %w", mode, err)
		m.setState(consensusv1.LifecycleState_LIFECYCLE_STATE_FAILED, err.Error())
		return err
	}
	done := make(chan struct{})
	m.mu.Lock()
	m.etcd, m.done = e, done
	m.mu.Unlock()
	go m.watch(e, done)

	// Finishing the start must not depend on the caller: a restarted member
	// may wait long for its quorum, and must still come up when it returns.
	ready := make(chan error, 1)
	go func() { ready <- m.finishStart(e, done, mode, begun) }()
	select {
	case err := <-ready:
		return err
	case <-ctx.Done():
		return fmt.Errorf("etcd is still starting (%s): %w", mode, ctx.Err())
	}
}

// finishStart waits until etcd serves, then opens the cluster client and
// marks the member running.
func (m *member) finishStart(e *embed.Etcd, done chan struct{}, mode startMode, begun time.Time) error {
	failpoint.Hold("before-ready")
	select {
	case <-e.Server.ReadyNotify():
	case <-done:
		return fmt.Errorf("etcd stopped while starting: %s", m.stateReason())
	}
	cli, err := m.newClusterClient(e)
	if err != nil {
		e.Server.Stop()
		return err
	}
	id := uint64(e.Server.MemberID())
	m.mu.Lock()
	if m.etcd != e {
		// Stopped meanwhile.
		m.mu.Unlock()
		cli.Close()
		return fmt.Errorf("etcd stopped while starting: %s", m.stateReason())
	}
	m.client = cli
	m.kept.MemberID = id
	m.kept.ClusterID = uint64(e.Server.Cluster().ID())
	m.kept.Endpoints = cli.Endpoints()
	m.state = consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING
	m.reason = ""
	m.ranOnceClose.Do(func() { close(m.ranOnce) })
	err = m.save()
	m.mu.Unlock()
	if err != nil {
		return err
	}
	m.log.Info("etcd serving", "mode", mode.String(), "member", types.ID(id).String(), "took", time.Since(begun).Round(time.Millisecond))
	return nil
}

// watch records why an etcd instance stopped.
func (m *member) watch(e *embed.Etcd, done chan struct{}) {
	var reason string
	select {
	case err := <-e.Err():
		reason = fmt.Sprintf("etcd failed: %v", err)
	case <-e.Server.StopNotify():
		reason = "etcd stopped"
	}
	id := uint64(e.Server.MemberID())
	removed := e.Server.IsIDRemoved(id)
	e.Close()

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.client != nil {
		m.client.Close()
		m.client = nil
	}
	m.etcd = nil
	state := consensusv1.LifecycleState_LIFECYCLE_STATE_STOPPED
	switch {
	case removed:
		reason = fmt.Sprintf("member %s was removed from the cluster; call Leave to wipe its data", types.ID(id))
		if m.kept.MemberID == id && !m.kept.Removed {
			m.kept.Removed = true
			if err := m.save(); err != nil {
				m.log.Warn("remember the removal", "err", err)
			}
		}
	case strings.HasPrefix(reason, "etcd failed"):
		state = consensusv1.LifecycleState_LIFECYCLE_STATE_FAILED
	}
	if m.state != consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE {
		m.state, m.reason = state, reason
	}
	if m.stopping {
		m.log.Info("etcd stopped", "member", types.ID(id).String())
	} else {
		m.log.Warn("etcd stopped", "member", types.ID(id).String(), "reason", reason)
	}
	m.stopping = false
	close(done)
}

// stop stops etcd (if running) and waits for it.
func (m *member) stop() {
	m.mu.Lock()
	e, done := m.etcd, m.done
	m.stopping = e != nil
	m.mu.Unlock()
	if e == nil {
		return
	}
	e.Server.Stop()
	<-done
}

func (m *member) setState(s consensusv1.LifecycleState, reason string) {
	m.mu.Lock()
	m.state, m.reason = s, reason
	m.mu.Unlock()
}

func (m *member) stateReason() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reason
}

// lockChanges waits for this process's change lock until ctx ends; the
// caller calls unlock.
func (m *member) lockChanges(ctx context.Context) (unlock func(), err error) {
	select {
	case m.changes <- struct{}{}:
		return func() { <-m.changes }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for this process's membership change in progress: %w", ctx.Err())
	}
}

// running returns the etcd instance and the cluster client, or errNotRunning.
func (m *member) running() (*embed.Etcd, *clientv3.Client, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state != consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING || m.etcd == nil || m.client == nil {
		reason := m.reason
		if reason == "" {
			reason = strings.ToLower(strings.TrimPrefix(m.state.String(), "LIFECYCLE_STATE_"))
		}
		return nil, nil, fmt.Errorf("%w (%s)", errNotRunning, reason)
	}
	return m.etcd, m.client, nil
}

// removed reports whether the local etcd learned that its member was removed.
func (m *member) removed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.kept.Removed
}

// awaitStop waits (until ctx ends) for etcd instance e to have stopped and
// its state recorded, if it is stopping.
func (m *member) awaitStop(ctx context.Context, e *embed.Etcd) {
	select {
	case <-e.Server.StopNotify():
	default:
		return
	}
	m.mu.Lock()
	done := m.done
	m.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// status reports the local member from the embedded server itself, so that
// it works for learners and without quorum.
func (m *member) status() *consensusv1.StatusResponse {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := &consensusv1.StatusResponse{
		NodeId:      m.cfg.nodeID,
		MemberId:    m.kept.MemberID,
		State:       m.state,
		StateReason: m.reason,
		PeerUrls:    []string{m.cfg.AdvertisePeerURL},
		ClientUrls:  []string{m.cfg.AdvertiseClientURL},
		EtcdVersion: version.Version,
		PublicKey:   m.id.key.Public().(ed25519.PublicKey),
	}
	st.Certificate, st.MemberCertificate = m.id.pems()
	if e := m.etcd; e != nil {
		// Also while it starts, e.g. a restarted member that waits for
		// its quorum: a recovery chooses its survivor by these.
		srv := e.Server
		st.LeaderId = srv.Lead()
		st.RaftIndex = srv.AppliedIndex()
		st.RaftTerm = srv.Term()
		st.DbSize = srv.Backend().Size()
	}
	if e := m.etcd; e != nil && m.state == consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING {
		srv := e.Server
		st.MemberId = uint64(srv.MemberID())
		st.ClusterId = uint64(srv.Cluster().ID())
		// Not srv.IsLearner: it panics once this member is removed.
		if self := srv.Cluster().Member(srv.MemberID()); self != nil {
			st.Learner = self.IsLearner
		} else {
			st.StateReason = "this member is no longer in the cluster; etcd is stopping"
		}
		st.Leader = srv.Lead() == uint64(srv.MemberID())
	}
	return st
}

// wipe deletes this node's etcd data. Only Leave calls it, after checking
// that the node is no longer a member.
func (m *member) wipe() error {
	for _, p := range []string{m.etcdDir(), m.statePath()} {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("wipe %s: %w", p, err)
		}
	}
	if err := m.id.dropMember(); err != nil {
		return fmt.Errorf("wipe the member certificate: %w", err)
	}
	m.mu.Lock()
	m.kept = persisted{}
	m.state, m.reason = consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE, ""
	m.mu.Unlock()
	return nil
}

// etcdConfig builds the embedded etcd's configuration. etcd's ports use our
// cluster CA and the member certificate: the client port admits the curator
// and member identities, the peer port only members (etcd checks the
// certificate CN, which pki sets to the principal kind), whose certificate
// must name the address they connect from.
func (m *member) etcdConfig(mode startMode, initialCluster string) (*embed.Config, error) {
	peer, err := url.Parse(m.cfg.AdvertisePeerURL)
	if err != nil {
		return nil, err
	}
	client, err := url.Parse(m.cfg.AdvertiseClientURL)
	if err != nil {
		return nil, err
	}
	ec := embed.NewConfig()
	ec.Name = m.cfg.nodeID
	ec.Dir = m.etcdDir()
	// etcd's peer API is served on a unix socket; the peer gate
	// (peergate.go) listens on --listen-peer and forwards to it.
	ec.ListenPeerUrls = []url.URL{{Scheme: "unix", Host: m.peerSocket}}
	ec.AdvertisePeerUrls = []url.URL{*peer}
	ec.ListenClientUrls = []url.URL{{Scheme: "https", Host: m.cfg.ListenClient}}
	ec.AdvertiseClientUrls = []url.URL{*client}
	ec.InitialClusterToken = m.cfg.Cluster
	// Both positive (Config.Validate): an int64 fits a uint.
	ec.TickMs = uint(m.cfg.TickInterval / time.Millisecond)        //nolint:gosec // G115: positive, see Validate
	ec.ElectionMs = uint(m.cfg.ElectionTimeout / time.Millisecond) //nolint:gosec // G115: positive, see Validate
	ec.UnsafeNoFsync = m.cfg.UnsafeNoFsync
	ec.QuotaBackendBytes = m.cfg.QuotaBackendBytes
	ec.StrictReconfigCheck = !m.cfg.UnsafeNoStrictReconfig
	ec.EnableGRPCGateway = false
	// Clients ping every rpc.KeepAliveTime (etcd's default refuses pings
	// less than 5 s apart).
	ec.GRPCKeepAliveMinTime = time.Second
	ec.AutoCompactionMode = "periodic"
	ec.AutoCompactionRetention = "1h"
	ec.Logger = "zap"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(m.zap)

	if _, err := m.id.memberCreds(); err != nil {
		return nil, err
	}
	base := transport.TLSInfo{
		// Read again for every handshake: a renewed certificate is used
		// at once.
		CertFile:       m.id.memberCertPath(),
		KeyFile:        m.id.keyPath,
		TrustedCAFile:  m.cfg.TLS.CA,
		ClientCertAuth: true,
		MinVersion:     tls.VersionTLS13,
	}
	if _, err := os.Stat(m.crlPath()); err == nil {
		base.CRLFile = m.crlPath()
	} else {
		m.log.Warn("no revocation list: etcd's ports will not check revocation until this member restarts with one (give consensus --crl)")
	}
	// The file is read for each new connection; a connection opened
	// before a revocation is refused at its next call.
	ec.GRPCAdditionalServerOptions = []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(m.refuseRevokedUnary),
		grpc.ChainStreamInterceptor(m.refuseRevokedStream),
	}
	ec.ClientTLSInfo = base
	ec.ClientTLSInfo.AllowedCNs = []string{string(pki.KindCurator), string(pki.KindMember)}
	// Clients are who their certificate says, from wherever they connect
	// (curators move; containers change addresses).
	ec.ClientTLSInfo.SkipClientSANVerify = true
	ec.PeerTLSInfo = base
	ec.PeerTLSInfo.AllowedCNs = []string{string(pki.KindMember)}
	// A peer's certificate must name the address it connects from (etcd
	// resolves its DNS names), so a member certificate works only from
	// its member's host.
	ec.PeerTLSInfo.SkipClientSANVerify = false

	switch mode {
	case modeBootstrap:
		ec.ClusterState = embed.ClusterStateFlagNew
		ec.InitialCluster = fmt.Sprintf("%s=%s", m.cfg.nodeID, m.cfg.AdvertisePeerURL)
	case modeJoin:
		ec.ClusterState = embed.ClusterStateFlagExisting
		ec.InitialCluster = initialCluster
	case modeRestart:
		// etcd ignores the initial cluster once it has data, but the
		// config must still name this member.
		ec.ClusterState = embed.ClusterStateFlagExisting
		ec.InitialCluster = fmt.Sprintf("%s=%s", m.cfg.nodeID, m.cfg.AdvertisePeerURL)
	}
	return ec, nil
}

// newClusterClient opens a client to the cluster's voters. A learner cannot
// answer member lists or linearizable reads, so the client never talks to
// learners. followVoters keeps its endpoints on the current voters. The
// client accepts only answers of the local member's own cluster
// (platform/etcdpin): an address that a member of another cluster took
// over (an old member of a cluster a recovery superseded) is refused, not
// written to.
func (m *member) newClusterClient(e *embed.Etcd) (*clientv3.Client, error) {
	eps := voterEndpoints(e)
	if len(eps) == 0 {
		return nil, errors.New("no voter with client URLs in the local view of the cluster")
	}
	cli, err := m.dial(eps, etcdpin.New(uint64(e.Server.Cluster().ID())).DialOptions()...)
	if err != nil {
		return nil, err
	}
	go m.followVoters(e, cli)
	return cli, nil
}

// voterEndpoints are the client URLs of the voters in the local member's
// view of the cluster (applied membership, no RPC needed).
func voterEndpoints(e *embed.Etcd) []string {
	var eps []string
	for _, mem := range e.Server.Cluster().Members() {
		if !mem.IsLearner && mem.Name != "" {
			eps = append(eps, mem.ClientURLs...)
		}
	}
	slices.Sort(eps)
	return eps
}

// endpointsMu keeps SetEndpoints apart from calls to one endpoint
// (statusAt): etcd's client (v3.7.3) dials one endpoint reading its
// endpoint list unguarded, which SetEndpoints writes; the race detector
// found it.
var endpointsMu sync.RWMutex

// statusAt is cli.Status(ctx, url), never concurrent with SetEndpoints.
func statusAt(ctx context.Context, cli *clientv3.Client, url string) (*clientv3.StatusResponse, error) {
	endpointsMu.RLock()
	defer endpointsMu.RUnlock()
	return cli.Status(ctx, url)
}

// followVoters points the client at the current voters whenever membership
// changes (this member's promotion, a removed voter), until etcd stops. A
// client left on a removed voter would hang until its caller's deadline.
func (m *member) followVoters(e *embed.Etcd, cli *clientv3.Client) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	last := voterEndpoints(e)
	for {
		select {
		case <-e.Server.StopNotify():
			return
		case <-cli.Ctx().Done():
			return
		case <-tick.C:
		}
		eps := voterEndpoints(e)
		if len(eps) == 0 || slices.Equal(eps, last) {
			continue
		}
		endpointsMu.Lock()
		cli.SetEndpoints(eps...)
		endpointsMu.Unlock()
		last = eps
		m.log.Debug("etcd client endpoints follow the voters", "endpoints", eps)
	}
}

func (m *member) dial(endpoints []string, opts ...grpc.DialOption) (*clientv3.Client, error) {
	creds, err := m.id.memberCreds()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            endpoints,
		TLS:                  rpc.ClientTLSConfig(creds, []pki.Kind{pki.KindMember}),
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    rpc.KeepAliveTime,
		DialKeepAliveTimeout: rpc.KeepAliveTimeout,
		// Never idle: see below.
		DialOptions: append([]grpc.DialOption{grpc.WithIdleTimeout(0), grpc.WithConnectParams(rpc.Reconnect)}, opts...),
		Logger:      m.zap,
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", endpoints, err)
	}
	// etcd's resolver is built when the connection leaves idle mode, and
	// that build races with SetEndpoints (followVoters) in etcd's client
	// (v3.7.3: both touch the resolver's fields unguarded; the race
	// detector found it). Connect leaves idle mode now, synchronously,
	// before anything calls SetEndpoints; with no idle timeout it never
	// enters it again.
	cli.ActiveConnection().Connect()
	return cli, nil
}

// rememberJoin keeps the member id a join starts as, and the voters it
// joins through, for Leave.
func (m *member) rememberJoin(id uint64, voters []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.kept = persisted{MemberID: id, Endpoints: slices.Sorted(slices.Values(voters))}
	return m.save()
}

// rememberEndpoints keeps the voters' client URLs for Leave.
func (m *member) rememberEndpoints(members []*etcdMember) {
	var eps []string
	for _, mem := range members {
		if !mem.IsLearner && mem.Name != "" {
			eps = append(eps, mem.ClientURLs...)
		}
	}
	slices.Sort(eps)
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(eps) == 0 || slices.Equal(eps, m.kept.Endpoints) {
		return
	}
	m.kept.Endpoints = eps
	if err := m.save(); err != nil {
		m.log.Warn("remember endpoints", "err", err)
	}
}

// loadCRL loads the revocation list kept in the data directory, else the
// deployment's (--crl).
func (m *member) loadCRL() error {
	if der, err := os.ReadFile(m.crlPath()); err == nil {
		if _, err := m.crl.Set(pki.EncodeCRLPEM(der)); err != nil {
			return fmt.Errorf("%s: %w", m.crlPath(), err)
		}
		return nil
	}
	if m.cfg.CRL == "" {
		return nil
	}
	b, err := os.ReadFile(m.cfg.CRL)
	if err != nil {
		return fmt.Errorf("--crl: %w", err)
	}
	if _, err := m.crl.Set(b); err != nil {
		return fmt.Errorf("--crl %s: %w", m.cfg.CRL, err)
	}
	return m.saveCRL()
}

// setCRL loads a revocation list from join parameters (PEM; nothing when
// empty) and writes the newest known to the file etcd's ports read, before
// the member starts.
func (m *member) setCRL(crlPEM []byte) error {
	if len(bytes.TrimSpace(crlPEM)) > 0 {
		if _, err := m.crl.Set(crlPEM); err != nil && !errors.Is(err, crl.ErrOlder) {
			return fmt.Errorf("%w: the join parameters' CRL: %v", errBadRequest, err)
		}
	}
	return m.saveCRL()
}

// requireCRL refuses to start a new member without a revocation list:
// etcd's ports would never check revocation.
func (m *member) requireCRL() error {
	if _, der, _, _ := m.crl.Current(); der == nil {
		return fmt.Errorf("%w: no revocation list known, so etcd's ports could not refuse revoked certificates: start consensus with --crl (crl.pem from curia-pki), or join with parameters that carry one", errRefused)
	}
	return nil
}

// saveCRL writes the newest revocation list known to crl.der, as DER: etcd
// reads the file with x509.ParseRevocationList, and rejects every peer and
// client connection with "malformed crl" when it is PEM.
func (m *member) saveCRL() error {
	m.crlFileMu.Lock()
	defer m.crlFileMu.Unlock()
	_, der, _, _ := m.crl.Current()
	if der == nil {
		return nil
	}
	if old, err := os.ReadFile(m.crlPath()); err == nil && bytes.Equal(old, der) {
		return nil
	}
	return pki.WriteFileAtomic(m.crlPath(), der, 0o600)
}

// keepCRLFile rewrites crl.der whenever a newer revocation list is known,
// until ctx ends; etcd reads the file for every new connection.
func (m *member) keepCRLFile(ctx context.Context) error {
	for {
		_, _, _, changed := m.crl.Current()
		if err := m.saveCRL(); err != nil {
			m.log.Error("write the revocation list for etcd's ports", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// refuseRevokedUnary and refuseRevokedStream run on etcd's client port:
// every call of a revoked certificate is refused, on connections opened
// before the revocation too.
func (m *member) refuseRevokedUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := m.checkRevoked(ctx); err != nil {
		return nil, err
	}
	if info.FullMethod == maintenanceStatus {
		return removedIsUnavailable(ctx, req, handler)
	}
	return handler(ctx, req)
}

// maintenanceStatus is etcd's Maintenance.Status on its client port.
const maintenanceStatus = "/etcdserverpb.Maintenance/Status"

// removedIsUnavailable runs etcd's Maintenance.Status, whose answer
// includes IsLearner, and that panics ("failed to find local ID in cluster
// members", etcd v3.7.3) on a member that has applied its own removal and
// not stopped yet: the curators ask every voter's status every second (the
// endpoint prober, snapshots), and a frozen member that was removed meets
// that call when it thaws (TestAutopilot saw the process die of it). The
// panic is the removal's, in a read that holds no state: it answers
// Unavailable, and etcd stops the member on its own.
func removedIsUnavailable(ctx context.Context, req any, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			resp, err = nil, status.Errorf(codes.Unavailable, "this etcd member is no longer in its cluster (removed): %v", r)
		}
	}()
	return handler(ctx, req)
}

func (m *member) refuseRevokedStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := m.checkRevoked(ss.Context()); err != nil {
		return err
	}
	return handler(srv, ss)
}

func (m *member) checkRevoked(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil // in-process calls
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	for _, c := range info.State.PeerCertificates {
		if m.crl.IsRevoked(c) {
			return status.Errorf(codes.Unauthenticated, "certificate %s is revoked", c.SerialNumber.Text(16))
		}
	}
	return nil
}

// ensureClusterID writes keys.ClusterID if it is missing (a cluster that
// predates it, or a new one). A recovery overwrites it (recover.go).
func ensureClusterID(ctx context.Context, cli *clientv3.Client, id uint64) error {
	_, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(keys.ClusterID), "=", 0)).
		Then(clientv3.OpPut(keys.ClusterID, types.ID(id).String())).
		Commit()
	return err
}

// ensureEpoch creates the membership epoch key if it is missing (a new
// cluster, or one whose key was lost), so that the epoch is never 0 while a
// cluster exists: every change needs an epoch.
func ensureEpoch(ctx context.Context, cli *clientv3.Client, recorder string) error {
	_, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(keys.MembershipEpoch), "=", 0)).
		Then(clientv3.OpPut(keys.MembershipEpoch, recorder)).
		Commit()
	if err != nil {
		return fmt.Errorf("create membership epoch: %w", err)
	}
	return nil
}
