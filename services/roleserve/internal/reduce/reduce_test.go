package reduce

import (
	"crypto/x509"
	"math/big"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
)

// fixture is a cluster CA, another CA, and valid join parameters.
type fixture struct {
	ca, other *pki.CA
	join      *consensusv1.JoinParameters
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ca, err := pki.NewCA("test.curia", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("test.curia", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{ca: ca, other: other, join: &consensusv1.JoinParameters{
		CaCertificate: ca.CertPEM,
		Voters:        []*consensusv1.Peer{{Name: "node-a", PeerUrls: []string{"https://10.0.0.1:2380"}, ClientUrls: []string{"https://10.0.0.1:2379"}}},
		MemberId:      0x1234,
		PeerUrl:       "https://10.0.0.2:2380",
	}}
}

// joinWith is the fixture's join parameters changed by f.
func (f *fixture) joinWith(f2 func(*consensusv1.JoinParameters)) *consensusv1.JoinParameters {
	j := proto.Clone(f.join).(*consensusv1.JoinParameters)
	if f2 != nil {
		f2(j)
	}
	return j
}

func (f *fixture) crl(t *testing.T, ca *pki.CA) []byte {
	t.Helper()
	b, err := ca.CRL([]x509.RevocationListEntry{{SerialNumber: big.NewInt(7), RevocationTime: time.Now()}}, big.NewInt(1), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func member(j *consensusv1.JoinParameters) *curatorv1.Roles {
	return &curatorv1.Roles{ConsensusMember: &curatorv1.ConsensusMember{Join: j}}
}

func TestReduce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ca := f.ca.Cert
	confirmed := func(r *curatorv1.Roles) Input {
		return Input{RolesConfirmed: true, Roles: r, ClusterCAs: []*x509.Certificate{ca}, LocalConsensus: true}
	}
	bad := func(change func(*consensusv1.JoinParameters)) Input { return confirmed(member(f.joinWith(change))) }
	tests := map[string]struct {
		in      Input
		decided bool
		run     bool
		mode    Mode
		says    string
	}{
		"bootstrap wins": {
			in:      Input{Bootstrapped: true, ClusterCAs: []*x509.Certificate{ca}, LocalConsensus: true},
			decided: true, run: true, mode: ModeBootstrap, says: "bootstrap data",
		},
		"bootstrap wins over roles not confirmed": {
			in:      Input{Bootstrapped: true, Roles: &curatorv1.Roles{}, ClusterCAs: []*x509.Certificate{ca}, LocalConsensus: true},
			decided: true, run: true, mode: ModeBootstrap,
		},
		"bootstrap without local consensus": {
			in:      Input{Bootstrapped: true, ClusterCAs: []*x509.Certificate{ca}},
			decided: true, mode: ModeNone, says: "--consensus",
		},
		"roles unknown": {
			in:   Input{ClusterCAs: []*x509.Certificate{ca}, LocalConsensus: true},
			says: "not known yet",
		},
		"no roles: no control plane": {
			in:      confirmed(nil),
			decided: true, mode: ModeNone, says: "no ConsensusMember",
		},
		"other roles only: no control plane": {
			in:      confirmed(&curatorv1.Roles{KubernetesWorker: &curatorv1.KubernetesWorker{}}),
			decided: true, mode: ModeNone,
		},
		"ConsensusMember: join": {
			in:      confirmed(member(f.join)),
			decided: true, run: true, mode: ModeJoin, says: "member 1234",
		},
		"ConsensusMember with a valid CRL": {
			in:      bad(func(j *consensusv1.JoinParameters) { j.Crl = f.crl(t, f.ca) }),
			decided: true, run: true, mode: ModeJoin,
		},
		"ConsensusMember without local consensus": {
			in:      Input{RolesConfirmed: true, Roles: member(f.join), ClusterCAs: []*x509.Certificate{ca}},
			decided: true, mode: ModeNone, says: "no local consensus",
		},
		"bootstrap node, roles confirmed, role kept: the role decides": {
			in:      Input{Bootstrapped: true, RolesConfirmed: true, Roles: member(f.join), ClusterCAs: []*x509.Certificate{ca}, LocalConsensus: true},
			decided: true, run: true, mode: ModeJoin,
		},
		"bootstrap node, roles confirmed, role removed: bootstrap data no longer counts": {
			in:      Input{Bootstrapped: true, RolesConfirmed: true, Roles: &curatorv1.Roles{KubernetesWorker: &curatorv1.KubernetesWorker{}}, ClusterCAs: []*x509.Certificate{ca}, LocalConsensus: true},
			decided: true, mode: ModeNone, says: "no ConsensusMember",
		},
		"unparsable: no join parameters": {
			in:   confirmed(&curatorv1.Roles{ConsensusMember: &curatorv1.ConsensusMember{}}),
			says: "no join parameters",
		},
		"unparsable: CA garbage": {
			in:   bad(func(j *consensusv1.JoinParameters) { j.CaCertificate = []byte("garbage") }),
			says: "CA certificate",
		},
		"unparsable: another cluster's CA": {
			in:   bad(func(j *consensusv1.JoinParameters) { j.CaCertificate = f.other.CertPEM }),
			says: "not this cluster's CA",
		},
		"unparsable: no voters": {
			in:   bad(func(j *consensusv1.JoinParameters) { j.Voters = nil }),
			says: "voters: must contain at least 1 item",
		},
		"unparsable: voters without client URLs": {
			in:   bad(func(j *consensusv1.JoinParameters) { j.Voters[0].ClientUrls = nil }),
			says: "at least one voter needs a client URL",
		},
		"unparsable: a broken client URL": {
			in:   bad(func(j *consensusv1.JoinParameters) { j.Voters[0].ClientUrls = []string{"http://10.0.0.1"} }),
			says: "voters[0].client_urls[0]: must be https://host:port",
		},
		"unparsable: no member id": {
			in:   bad(func(j *consensusv1.JoinParameters) { j.MemberId = 0 }),
			says: "member_id: must be greater than 0",
		},
		"unparsable: no peer URL": {
			in:   bad(func(j *consensusv1.JoinParameters) { j.PeerUrl = "" }),
			says: "peer_url: must be https://host:port",
		},
		"unparsable: CRL garbage": {
			in:   bad(func(j *consensusv1.JoinParameters) { j.Crl = []byte("garbage") }),
			says: "CRL",
		},
		"unparsable: CRL of another CA": {
			in:   bad(func(j *consensusv1.JoinParameters) { j.Crl = f.crl(t, f.other) }),
			says: "CRL",
		},
		"unparsable: no cluster CA to compare with": {
			in:   Input{RolesConfirmed: true, Roles: member(f.join), LocalConsensus: true},
			says: "no cluster CA",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := Reduce(tc.in)
			if d.Decided != tc.decided || d.Run != tc.run || d.Mode != tc.mode || !strings.Contains(d.Reason, tc.says) {
				t.Fatalf("got %+v\nwant decided=%v run=%v mode=%v saying %q", d, tc.decided, tc.run, tc.mode, tc.says)
			}
			if d.Run != (d.Mode != ModeNone) {
				t.Fatalf("run=%v with mode %v", d.Run, d.Mode)
			}
			if (d.Mode == ModeJoin) != (d.Join != nil) {
				t.Fatalf("mode %v with join parameters %v", d.Mode, d.Join)
			}
		})
	}
}

// TestNext folds sequences of inputs the way the agent does and checks when
// the launcher acts: when "runs consensus" flips, or when the role names
// another member than the one in force.
func TestNext(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ca := f.ca.Cert
	roles := func(r *curatorv1.Roles) Input {
		return Input{RolesConfirmed: true, Roles: r, ClusterCAs: []*x509.Certificate{ca}, LocalConsensus: true}
	}
	cm := roles(member(f.join))
	none := roles(nil)
	worker := roles(&curatorv1.Roles{KubernetesWorker: &curatorv1.KubernetesWorker{}})
	cmWorker := roles(&curatorv1.Roles{ConsensusMember: &curatorv1.ConsensusMember{Join: f.join}, KubernetesWorker: &curatorv1.KubernetesWorker{}})
	cmController := roles(&curatorv1.Roles{ConsensusMember: &curatorv1.ConsensusMember{Join: f.join}, KubernetesController: &curatorv1.KubernetesController{}})
	cmResent := roles(member(f.joinWith(nil)))
	// The same member with other parameters: the voters to join through
	// changed, a new CRL.
	cmOtherParams := roles(member(f.joinWith(func(j *consensusv1.JoinParameters) {
		j.Voters = append(j.Voters, &consensusv1.Peer{Name: "node-c", PeerUrls: []string{"https://10.0.0.3:2380"}, ClientUrls: []string{"https://10.0.0.3:2379"}})
		j.Crl = f.crl(t, f.ca)
	})))
	// Another member for this node: it was removed from etcd and added
	// again (a new learner) while the agent did not see the role absent.
	cmOtherMember := roles(member(f.joinWith(func(j *consensusv1.JoinParameters) { j.MemberId = 0x99 })))
	cmBad := roles(member(f.joinWith(func(j *consensusv1.JoinParameters) { j.CaCertificate = f.other.CertPEM })))
	unknown := Input{ClusterCAs: []*x509.Certificate{ca}, LocalConsensus: true}
	boot := Input{Bootstrapped: true, ClusterCAs: []*x509.Certificate{ca}, LocalConsensus: true}
	bootConfirmed := func(in Input) Input { in.Bootstrapped = true; return in }

	tests := map[string]struct {
		steps []Input
		acts  []bool
		run   bool // in force at the end
		mode  Mode
	}{
		"nothing known: no decision, no action": {
			steps: []Input{unknown, unknown}, acts: []bool{false, false}, run: false, mode: ModeNone,
		},
		"first decision acts": {
			steps: []Input{unknown, cm}, acts: []bool{false, true}, run: true, mode: ModeJoin,
		},
		"no role: no control plane (and the first decision acts: stop anything left)": {
			steps: []Input{none}, acts: []bool{true}, run: false, mode: ModeNone,
		},
		"role gained, then lost": {
			steps: []Input{none, cm, none}, acts: []bool{true, true, true}, run: false, mode: ModeNone,
		},
		"unrelated role changes do not restart": {
			steps: []Input{cm, cmWorker, cm, cmController, cmResent, cmOtherParams},
			acts:  []bool{true, false, false, false, false, false}, run: true, mode: ModeJoin,
		},
		"unrelated role changes without ConsensusMember take no action": {
			steps: []Input{none, worker, none}, acts: []bool{true, false, false}, run: false, mode: ModeNone,
		},
		"unparsable role while running: no stop": {
			steps: []Input{cm, cmBad, cm}, acts: []bool{true, false, false}, run: true, mode: ModeJoin,
		},
		"unparsable role while not running: no start": {
			steps: []Input{none, cmBad}, acts: []bool{true, false}, run: false, mode: ModeNone,
		},
		"another member id acts (removed and added again while the agent missed the role absent)": {
			steps: []Input{cm, cmOtherMember}, acts: []bool{true, true}, run: true, mode: ModeJoin,
		},
		"another member id acts, also with unrelated changes in between": {
			steps: []Input{cm, cmWorker, cmOtherMember, cmOtherMember, cm},
			acts:  []bool{true, false, true, false, true}, run: true, mode: ModeJoin,
		},
		"another member id after an unparsable role acts": {
			steps: []Input{cm, cmBad, cmOtherMember}, acts: []bool{true, false, true}, run: true, mode: ModeJoin,
		},
		"another member id seen first while not running: one action": {
			steps: []Input{none, cmOtherMember, cmOtherMember}, acts: []bool{true, true, false}, run: true, mode: ModeJoin,
		},
		"unparsable role first: nothing decided": {
			steps: []Input{cmBad, cm}, acts: []bool{false, true}, run: true, mode: ModeJoin,
		},
		"bootstrap data gives way to the role without a restart": {
			steps: []Input{boot, bootConfirmed(cm), bootConfirmed(cmWorker)},
			acts:  []bool{true, false, false}, run: true, mode: ModeJoin,
		},
		"bootstrap node loses ConsensusMember although bootstrap data lingers": {
			steps: []Input{boot, bootConfirmed(cm), bootConfirmed(worker)},
			acts:  []bool{true, false, true}, run: false, mode: ModeNone,
		},
		"bootstrap node whose first confirmed roles lack ConsensusMember": {
			steps: []Input{boot, bootConfirmed(none)}, acts: []bool{true, true}, run: false, mode: ModeNone,
		},
		"bootstrap node restarted after confirmation: the role decides from the start": {
			steps: []Input{bootConfirmed(none)}, acts: []bool{true}, run: false, mode: ModeNone,
		},
		"bootstrap node with an unparsable role keeps running": {
			steps: []Input{boot, bootConfirmed(cmBad)}, acts: []bool{true, false}, run: true, mode: ModeBootstrap,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var inForce Decision
			for i, in := range tc.steps {
				var act bool
				inForce, act = Next(inForce, Reduce(in))
				if act != tc.acts[i] {
					t.Fatalf("step %d: act=%v, want %v (in force: %+v)", i, act, tc.acts[i], inForce)
				}
			}
			if inForce.Run != tc.run || inForce.Mode != tc.mode {
				t.Fatalf("in force %+v, want run=%v mode=%v", inForce, tc.run, tc.mode)
			}
		})
	}
	// The join parameters in force follow the role even without an action,
	// so that a start still retrying uses the newest ones.
	inForce, _ := Next(Decision{}, Reduce(cm))
	inForce, act := Next(inForce, Reduce(cmOtherParams))
	if act || !proto.Equal(inForce.Join, cmOtherParams.Roles.GetConsensusMember().GetJoin()) {
		t.Fatalf("act=%v, join in force %v", act, inForce.Join)
	}
	// Another member: the launcher acts with it.
	inForce, act = Next(inForce, Reduce(cmOtherMember))
	if !act || inForce.Join.GetMemberId() != 0x99 {
		t.Fatalf("act=%v, join in force %v", act, inForce.Join)
	}
}
