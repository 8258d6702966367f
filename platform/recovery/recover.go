package recovery

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/snapshots"
)

// Target is one node's consensus process.
type Target struct {
	// Name is what the recovery calls the node (node-1 for curia-local;
	// empty: the node id its process reports, else Addr).
	Name string
	// Addr is the consensus API's address, host:port.
	Addr string
	// NodeID is the node's id, if known beforehand (else the process's
	// Status says it).
	NodeID string
}

// Cluster is what the recovery needs to know of a deployment.
type Cluster struct {
	// Nodes are the consensus processes to survey, one a node: every
	// control-plane node's, ideally (a node not named is not compared).
	Nodes []Target
	// Curators are curator addresses: asked whether they answer for a
	// cluster with a leader (a quorum reachable), and, after the
	// recovery, for the regrowth.
	Curators []string
	// Credentials are the admin's.
	Credentials *rpc.Credentials
	// ControlPlane is the voter count to wait for when the cluster
	// configuration sets no control_plane_size (0: the number of Nodes).
	ControlPlane int
	// Snapshots, if set, lists the snapshots to compare the recovered data
	// with, newest first, and says where they are ("in .curia/snapshots").
	Snapshots func(ctx context.Context) ([]snapshots.Metadata, string, error)
}

// Options say how to recover.
type Options struct {
	// Confirm is the operator's consent: the node (its name or id) whose
	// data becomes the cluster (the survivor Recover chose, or the node to
	// restore the snapshot on). Without it, Recover only says what it
	// would do and returns ErrNoConsent.
	Confirm string
	// Snapshot is a snapshot file to restore instead of a survivor's data:
	// one ResolveSnapshot returned.
	Snapshot *Snapshot
	// Reason goes into the report and the audit log (default: DefaultReason).
	Reason string
	// Wait is how long to wait for the control plane to grow back to its
	// size (0: do not wait).
	Wait time.Duration
	// Settle is how long the survivors may take to notice the loss (no
	// leader anywhere) before a reachable leader means "refused".
	Settle time.Duration
	// Out gets the progress, for a person.
	Out io.Writer
	// Program prefixes the progress lines ("curia-local").
	Program string
}

// DefaultReason is the reason a recovery gives when the operator gives none.
const DefaultReason = "a majority of voters is lost"

// Sentinels: the refusals, which change nothing. Each error that wraps one
// says what to do next.
var (
	// ErrNoConsent: Recover said what it would do and changed nothing.
	ErrNoConsent = errors.New("nothing changed: run again with --confirm to proceed")
	// ErrQuorumReachable: a quorum is still seen; recovering would fork
	// the cluster.
	ErrQuorumReachable = errors.New("refused: a quorum is reachable")
	// ErrNoSurvivor: no surviving member holds data to recover from.
	ErrNoSurvivor = errors.New("no surviving member holds data that runs")
	// ErrUnknownNode: --confirm names no node the recovery surveyed.
	ErrUnknownNode = errors.New("no such node among the consensus processes surveyed")
	// ErrBadSnapshot: the snapshot file failed its checks.
	ErrBadSnapshot = errors.New("the snapshot file failed its checks")
)

// Report is what a recovery did (curia-local writes it to
// <state>/recovery-<time>.json).
type Report struct {
	StartedAt time.Time  `json:"started_at"`
	Survey    []Survivor `json:"survey"`
	Chosen    string     `json:"chosen"`
	Why       string     `json:"why"`
	// Consensus is the consensus process's own report (as stored in etcd).
	Consensus json.RawMessage `json:"consensus,omitempty"`
	// LostRevisions says what may be lost, against the other survivors and
	// the latest snapshot.
	LostRevisions []string  `json:"lost_revisions"`
	RecoveredAt   time.Time `json:"recovered_at"`
	Readded       []string  `json:"readded,omitempty"`
	Voters        int       `json:"voters,omitempty"`
	VotersAt      time.Time `json:"voters_at,omitzero"`
	VotersAfter   string    `json:"voters_after,omitempty"`
	ReportFile    string    `json:"-"`
}

// recovery is one run of Recover.
type recovery struct {
	c     Cluster
	opts  Options
	out   io.Writer
	conns map[string]*grpc.ClientConn // by Target.Addr
	// names maps node ids to the names the progress uses.
	names map[string]string
}

func (r *recovery) printf(format string, a ...any) {
	fmt.Fprintf(r.out, cmp.Or(r.opts.Program, "recovery")+": "+format, a...)
}

// nodeName is the name of the node with id (the id itself for a node the
// survey did not name).
func (r *recovery) nodeName(id string) string {
	if n, ok := r.names[id]; ok {
		return n
	}
	return id
}

// Recover rebuilds a cluster whose majority of voters is gone for good, from
// the most up-to-date survivor (or a snapshot), through the consensus
// processes' Recover (RestoreSnapshot) call, then waits while the reconciler
// and autopilot grow the control plane back. It refuses when a quorum is
// reachable: it goes on only once, for Settle on end, no curator answers
// for a cluster with a leader and no member follows one, and refuses when
// that has not happened within twice Settle.
//
// The report is returned as far as the recovery got, also with an error.
func Recover(ctx context.Context, c Cluster, opts Options) (*Report, error) {
	r := &recovery{c: c, opts: opts, out: cmp.Or[io.Writer](opts.Out, io.Discard), conns: map[string]*grpc.ClientConn{}, names: map[string]string{}}
	defer func() {
		for _, cc := range r.conns {
			cc.Close()
		}
	}()
	rep := &Report{StartedAt: time.Now().UTC()}
	c.Nodes = slices.Clone(c.Nodes) // the survey names them
	r.c = c
	if c.Credentials == nil {
		return nil, errors.New("recovery: no admin credentials")
	}
	if len(c.Nodes) == 0 {
		return nil, errors.New("recovery: no consensus address to survey")
	}
	for _, n := range c.Nodes {
		cc, err := rpc.Dial(n.Addr, rpc.ClientConfig{Credentials: c.Credentials, ServerKinds: []pki.Kind{pki.KindConsensus}})
		if err != nil {
			return nil, fmt.Errorf("consensus %s: %w", n.Addr, err)
		}
		r.conns[n.Addr] = cc
		if n.Name != "" && n.NodeID != "" {
			r.names[n.NodeID] = n.Name
		}
	}
	begun := time.Now()
	r.printf("recovering only once no quorum is seen for %v on end (refused if one is still seen after %v)\n", opts.Settle, 2*opts.Settle)
	last := ""
	err := AwaitLoss(ctx, opts.Settle, RealClock, func(ctx context.Context) string {
		rep.Survey = r.survey(ctx)
		seen, curators := r.quorumSeen(ctx, rep.Survey)
		// Say what changed, so a refusal (or a recovery) can be traced
		// to what was seen when.
		if now := settleLine(seen, curators, rep.Survey); now != last {
			fmt.Fprintf(r.out, "  +%.1fs %s\n", time.Since(begun).Seconds(), now)
			last = now
		}
		return seen
	})
	if err != nil {
		return nil, err
	}
	for _, s := range rep.Survey {
		fmt.Fprintf(r.out, "  %-8s %s\n", s.Node, s.describe())
	}

	if opts.Snapshot != nil {
		if opts.Confirm == "" {
			r.printf("would restore snapshot %s as a new cluster on the node you name\n", opts.Snapshot.Name)
			return rep, fmt.Errorf("%w: name the node to restore on (--confirm %s)", ErrNoConsent, firstAnswered(rep.Survey))
		}
		i := slices.IndexFunc(rep.Survey, func(s Survivor) bool { return s.Node == opts.Confirm || (s.NodeID != "" && s.NodeID == opts.Confirm) })
		if i < 0 {
			return rep, fmt.Errorf("--confirm %s: %w (%s)", opts.Confirm, ErrUnknownNode, surveyedNames(rep.Survey))
		}
		rep.Chosen = rep.Survey[i].Node
		rep.Why = "the operator named it to restore snapshot " + opts.Snapshot.Name + " on"
	} else {
		best, why, err := chooseSurvivor(rep.Survey)
		if err != nil {
			return rep, err
		}
		rep.Chosen, rep.Why = best.Node, why
		r.printf("the most up-to-date survivor is %s: %s\n", best.Node, why)
		if opts.Confirm != best.Node && (best.NodeID == "" || opts.Confirm != best.NodeID) {
			return rep, fmt.Errorf("%w: to make %s's data the cluster (members of the lost majority are dropped, and may hold writes it lacks), run again with --confirm %s", ErrNoConsent, best.Node, best.Node)
		}
	}
	chosen := rep.Survey[slices.IndexFunc(rep.Survey, func(s Survivor) bool { return s.Node == rep.Chosen })]
	cli := consensusv1.NewConsensusClient(r.conns[chosen.addr])
	reason := cmp.Or(opts.Reason, cmp.Or(opts.Program, "recovery")+" recover: "+DefaultReason)
	var cr *consensusv1.RecoveryReport
	if opts.Snapshot != nil {
		if chosen.NodeID == "" {
			return rep, fmt.Errorf("%s: its consensus process did not say its node id (%s): it must answer to restore on it", chosen.Node, cmp.Or(chosen.Error, "no answer"))
		}
		cr, err = restoreSnapshot(ctx, cli, chosen.NodeID, opts.Snapshot, reason)
	} else {
		var resp *consensusv1.RecoverResponse
		resp, err = cli.Recover(ctx, &consensusv1.RecoverRequest{MemberId: chosen.member, Reason: reason})
		cr = resp.GetReport()
	}
	if err != nil {
		return rep, fmt.Errorf("recover on %s: %w", rep.Chosen, err)
	}
	rep.RecoveredAt = time.Now().UTC()
	rep.Consensus, _ = protojson.Marshal(cr)
	rep.LostRevisions = r.lostRevisions(ctx, rep, cr)
	r.printf("%s is cluster %s (member %s) from revision %d, revisions moved to %d; old data kept in %s\n",
		rep.Chosen, types.ID(cr.GetNewClusterId()), types.ID(cr.GetNewMemberId()), cr.GetRevision(), cr.GetNewRevision(), cmp.Or(cr.GetKeptDataDir(), "(none)"))
	for _, l := range rep.LostRevisions {
		fmt.Fprintln(r.out, "  "+l)
	}
	if opts.Wait > 0 {
		if err := r.waitRegrown(ctx, rep, opts.Wait); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// firstAnswered is the name of the first node that answered the survey,
// for an example ("NODE" if none did).
func firstAnswered(all []Survivor) string {
	for _, s := range all {
		if s.Answered {
			return s.Node
		}
	}
	return "NODE"
}

// surveyedNames lists the nodes surveyed, for an error.
func surveyedNames(all []Survivor) string {
	var ns []string
	for _, s := range all {
		n := s.Node
		if s.NodeID != "" && s.NodeID != s.Node {
			n += " (" + s.NodeID + ")"
		}
		ns = append(ns, n)
	}
	return "surveyed: " + fmt.Sprint(ns)
}
