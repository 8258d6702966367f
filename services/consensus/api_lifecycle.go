package consensus

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

func (x *server) Start(ctx context.Context, req *consensusv1.StartRequest) (*consensusv1.StartResponse, error) {
	resp, err := x.start(ctx, req)
	return resp, err
}

// start: one of bootstrap and join is the request's contract, and so is
// the shape of the join parameters (a member id, https URLs, a voter with
// a client URL); whether they are for this cluster and node is checked
// here.
func (x *server) start(ctx context.Context, req *consensusv1.StartRequest) (*consensusv1.StartResponse, error) {
	m := x.s.member
	if j := req.GetJoin(); j != nil {
		if err := x.validateJoin(j); err != nil {
			return nil, err
		}
	}
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()

	switch st := m.status(); st.State {
	case consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING, consensusv1.LifecycleState_LIFECYCLE_STATE_STARTING:
		return &consensusv1.StartResponse{Status: st, AlreadyStarted: true}, nil
	}
	if m.hasData() {
		return nil, fmt.Errorf("%w: this node holds data of member %s that is not running (%s): call Leave to wipe it before starting anew",
			errRefused, types.ID(m.status().MemberId), m.stateReason())
	}
	if err := x.checkMemberCert(); err != nil {
		return nil, err
	}

	sctx, cancel := context.WithTimeout(ctx, x.s.cfg.StartTimeout)
	defer cancel()
	if req.GetBootstrap() != nil {
		if err := m.requireCRL(); err != nil {
			return nil, err
		}
		if err := m.start(sctx, modeBootstrap, ""); err != nil {
			return nil, err
		}
		e, cli, err := m.running()
		if err != nil {
			return nil, err
		}
		if err := ensureEpoch(sctx, cli, "consensus/"+x.s.cfg.nodeID); err != nil {
			return nil, err
		}
		if err := ensureClusterID(sctx, cli, uint64(e.Server.Cluster().ID())); err != nil {
			return nil, err
		}
		return &consensusv1.StartResponse{Status: m.status()}, nil
	}

	j := req.GetJoin()
	initial, err := x.initialCluster(sctx, j)
	if err != nil {
		return nil, err
	}
	if err := m.setCRL(j.GetCrl()); err != nil {
		return nil, err
	}
	if err := m.requireCRL(); err != nil {
		return nil, err
	}
	// Remembered before etcd writes anything: if the member is removed
	// while it starts, etcd stops with data on disk and no member id of its
	// own to report, and Leave must still be able to ask the voters whether
	// this member is gone.
	var voters []string
	for _, v := range j.GetVoters() {
		voters = append(voters, v.GetClientUrls()...)
	}
	if err := m.rememberJoin(j.GetMemberId(), voters); err != nil {
		return nil, err
	}
	if err := m.start(sctx, modeJoin, initial); err != nil {
		return nil, err
	}
	return &consensusv1.StartResponse{Status: m.status()}, nil
}

// checkMemberCert refuses to start a member without a member certificate
// that names this member's peer host (peers bind it to that address).
func (x *server) checkMemberCert() error {
	creds, err := x.s.member.id.memberCreds()
	if err != nil {
		return err
	}
	u, err := url.Parse(x.s.cfg.AdvertisePeerURL)
	if err != nil {
		return err
	}
	return coversHost(creds, u.Hostname())
}

func (x *server) SetCredentials(ctx context.Context, req *consensusv1.SetCredentialsRequest) (*consensusv1.SetCredentialsResponse, error) {
	id := x.s.member.id
	for _, c := range []struct {
		kind pki.Kind
		pem  []byte
	}{{pki.KindConsensus, req.GetCertificate()}, {pki.KindMember, req.GetMemberCertificate()}} {
		if len(c.pem) == 0 {
			continue
		}
		if err := id.set(c.kind, c.pem); err != nil {
			return nil, err
		}
		x.s.log.Info("certificate installed", "kind", string(c.kind), "expires", id.notAfter(c.kind))
	}
	return &consensusv1.SetCredentialsResponse{Status: x.s.member.status()}, nil
}

// validateJoin checks that the join parameters are for this node and
// cluster: a CA in common with ours and our own peer URL.
func (x *server) validateJoin(j *consensusv1.JoinParameters) error {
	if len(j.GetCaCertificate()) > 0 {
		// Bundles may differ while a CA rotation rolls out; one CA in
		// common says it is this cluster.
		theirs, err := pki.ParseCertsPEM(j.GetCaCertificate())
		ours, oerr := pki.ParseCertsPEM(x.s.creds.CAPEM)
		if err != nil || oerr != nil || !pki.SharesCert(theirs, ours) {
			return fmt.Errorf("%w: join parameters carry another cluster CA than this node's: they are for another cluster", errBadRequest)
		}
	}
	if j.GetPeerUrl() != x.s.cfg.AdvertisePeerURL {
		return fmt.Errorf("%w: join parameters are for peer URL %q but this node advertises %q: add the node again with its real peer URL", errBadRequest, j.GetPeerUrl(), x.s.cfg.AdvertisePeerURL)
	}
	return nil
}

// initialCluster builds etcd's initial cluster for a join from the current
// member list, read from the voters in the join parameters. etcd wants every
// member in it, so a list frozen at AddNode time would fail as soon as any
// other member changed.
func (x *server) initialCluster(ctx context.Context, j *consensusv1.JoinParameters) (string, error) {
	var eps []string
	for _, v := range j.GetVoters() {
		eps = append(eps, v.GetClientUrls()...)
	}
	cli, err := x.s.member.dial(eps)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	list, err := cli.MemberList(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: read the member list from the voters %v: %v", errCannotConfirm, eps, err)
	}
	var parts []string
	found := false
	for _, mem := range list.Members {
		name := mem.Name
		if mem.ID == j.GetMemberId() {
			if !slices.Contains(mem.PeerURLs, x.s.cfg.AdvertisePeerURL) {
				return "", fmt.Errorf("%w: member %s has peer URLs %v, not this node's %s", errBadRequest, types.ID(mem.ID), mem.PeerURLs, x.s.cfg.AdvertisePeerURL)
			}
			name, found = x.s.cfg.nodeID, true
		} else if name == "" {
			name = "unstarted-" + types.ID(mem.ID).String()
		}
		for _, u := range mem.PeerURLs {
			parts = append(parts, name+"="+u)
		}
	}
	if !found {
		return "", fmt.Errorf("%w: member %s is not in the cluster (removed since it was added?): add the node again", errRefused, types.ID(j.GetMemberId()))
	}
	return strings.Join(parts, ","), nil
}

func (x *server) Leave(ctx context.Context, _ *consensusv1.LeaveRequest) (*consensusv1.LeaveResponse, error) {
	resp, err := x.leave(ctx)
	return resp, err
}

// leave wipes this node's member once the cluster confirms it is no longer a
// member. Data of a member is never wiped on a guess: if no voter answers,
// the call fails and the data stays.
func (x *server) leave(ctx context.Context) (*consensusv1.LeaveResponse, error) {
	m := x.s.member
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()

	if !m.hasData() && m.status().State != consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING {
		if err := m.wipe(); err != nil {
			return nil, err
		}
		return &consensusv1.LeaveResponse{AlreadyIdle: true}, nil
	}
	if !m.removed() {
		if err := x.confirmNotMember(ctx); err != nil && !m.removed() {
			return nil, err
		}
	}
	m.stop()
	if err := m.wipe(); err != nil {
		return nil, err
	}
	x.s.log.Info("left the cluster and wiped etcd data")
	return &consensusv1.LeaveResponse{}, nil
}

// confirmNotMember asks the cluster (through the local client if etcd runs,
// else through the voters remembered on disk, and when etcd refuses this
// member's revoked certificate, through the curators) whether this node
// still has a member, by member id, name or peer URL.
func (x *server) confirmNotMember(ctx context.Context) error {
	m := x.s.member
	m.mu.Lock()
	kept := m.kept
	m.mu.Unlock()
	id := m.status().MemberId
	if id == 0 {
		id = kept.MemberID
	}
	var members []*consensusv1.Member
	var clusterID uint64
	superseded := false
	err := fmt.Errorf("%w: the member certificate is revoked, etcd refuses it", errCannotConfirm)
	if !m.id.memberRevoked() {
		// Bounded, so that the curators are still asked before the
		// caller's deadline: a voter that refuses this member's
		// certificate (revoked, and this process has not seen the CRL
		// yet) or hangs is retried by etcd's client until the context
		// ends.
		ectx, cancel := context.WithTimeout(ctx, askEtcdTimeout)
		members, clusterID, superseded, err = x.askEtcd(ectx, kept, id)
		cancel()
	}
	if err != nil && len(x.s.cfg.Curators) > 0 {
		var cerr error
		if members, cerr = x.askCurators(ctx); cerr == nil {
			err, clusterID = nil, 0
		} else {
			err = fmt.Errorf("%w; nor could the curators say: %v", err, cerr)
		}
	}
	if err != nil {
		return err
	}
	if clusterID != kept.ClusterID && kept.ClusterID != 0 && clusterID != 0 && !superseded {
		return fmt.Errorf("%w: the voters answering belong to cluster %s, not this member's %s; its data stays", errCannotConfirm, types.ID(clusterID), types.ID(kept.ClusterID))
	}
	for _, mem := range members {
		// The data on disk is member id's: only that member keeps it
		// alive. Another member of this node (removed and added again:
		// same name, same peer URL, a new id) cannot use it — etcd never
		// lets a removed id back —, so it does not hold the data here.
		// Only when the id is unknown do name and peer URL count.
		if mem.GetId() == id || (id == 0 && (mem.GetNodeId() == x.s.cfg.nodeID || slices.Contains(mem.GetPeerUrls(), x.s.cfg.AdvertisePeerURL))) {
			return fmt.Errorf("%w: member %s; remove it first (curator: UpdateNodeRoles consensus_member=false)", errStillMember, types.ID(mem.GetId()))
		}
	}
	return nil
}

// askEtcdTimeout bounds Leave's question to etcd, leaving the rest of the
// caller's time (the agent allows 30 s) to the curators.
const askEtcdTimeout = 5 * time.Second

// askEtcd reads the member list with this member's certificate: through
// the local client if etcd runs, else (or if it stopped meanwhile: a
// member that learns of its removal stops, and its client closes under the
// call) through the voters remembered on disk.
// When the answering cluster is another than this member's, it also says
// whether a recovery superseded this member's cluster by it (recover.go):
// then the member list answers for this member too.
func (x *server) askEtcd(ctx context.Context, kept persisted, id uint64) (_ []*consensusv1.Member, _ uint64, superseded bool, _ error) {
	m := x.s.member
	var list *clientv3.MemberListResponse
	var c *clientv3.Client
	if e, cli, err := m.running(); err == nil {
		if list, err = cli.MemberList(ctx); err != nil {
			// etcd may be stopping: it learned that its member was
			// removed, and its client closes. Once it stopped, the
			// voters it remembers answer, as for a stopped member.
			m.awaitStop(ctx, e)
			if _, _, rerr := m.running(); rerr == nil {
				return nil, 0, false, fmt.Errorf("%w: ask the cluster whether member %s is gone: %v; its data stays", errCannotConfirm, types.ID(id), err)
			}
			list = nil
		}
		c = cli
	}
	if list == nil {
		eps := slices.DeleteFunc(slices.Clone(kept.Endpoints), func(e string) bool { return e == x.s.cfg.AdvertiseClientURL })
		if len(eps) == 0 {
			return nil, 0, false, fmt.Errorf("%w: this node knows no other voter to confirm that member %s is gone; its data stays", errCannotConfirm, types.ID(id))
		}
		cli, err := m.dial(eps)
		if err != nil {
			return nil, 0, false, fmt.Errorf("%w: %v", errCannotConfirm, err)
		}
		defer cli.Close()
		c = cli
		if list, err = cli.MemberList(ctx); err != nil {
			return nil, 0, false, fmt.Errorf("%w: ask the voters %v whether member %s is gone: %v; its data stays", errCannotConfirm, eps, types.ID(id), err)
		}
	}
	var out []*consensusv1.Member
	for _, mem := range list.Members {
		out = append(out, &consensusv1.Member{Id: mem.ID, NodeId: mem.Name, PeerUrls: mem.PeerURLs})
	}
	if kept.ClusterID != 0 && list.Header.ClusterId != kept.ClusterID {
		resp, err := c.Get(ctx, keys.Superseded(kept.ClusterID))
		if err != nil {
			return nil, 0, false, fmt.Errorf("%w: cluster %s answers, not this member's %s, and whether a recovery superseded it is unknown: %v; its data stays", errCannotConfirm, types.ID(list.Header.ClusterId), types.ID(kept.ClusterID), err)
		}
		superseded = len(resp.Kvs) > 0
	}
	return out, list.Header.ClusterId, superseded, nil
}

// askCurators reads the member list through the curators, with this
// process's consensus certificate.
func (x *server) askCurators(ctx context.Context) ([]*consensusv1.Member, error) {
	// A connection of its own: the shared one may have been opened while
	// this process had only its self-signed certificate.
	cc, err := rpc.DialAny(x.s.cfg.Curators, rpc.ClientConfig{Credentials: x.s.creds, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := curatorv1.NewCuratorClient(cc).GetMembership(cctx, &curatorv1.GetMembershipRequest{})
	if err != nil {
		return nil, err
	}
	return resp.GetMembers().GetMembers(), nil
}
