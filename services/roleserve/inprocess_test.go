package roleserve_test

import (
	"context"
	"encoding/base64"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	roleservev1 "curia.dev/gen/curia/roleserve/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	cut "curia.dev/services/curator/curatortest"
	"curia.dev/services/roleserve"
)

// TestAgentInProcess runs the agent inside the test process, so that the
// race detector watches its goroutines (enrolment, role watch, control and
// launcher, heartbeats, status reports, API), against real consensus and
// curator processes: enrol, gain ConsensusMember, lose it while still a
// member (the leave is refused and then cancelled by the role coming
// back), lose it for real.
func TestAgentInProcess(t *testing.T) {
	c := cut.New(t, 1)
	a, n := c.NewConsensusAgent()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ticket, err := c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.MarshalEd25519PEM(n.Key)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "node.key")
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "roleserve.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("--- agent log ---\n%s", b)
		}
	})

	cfg := roleserve.DefaultConfig()
	cfg.Cluster = c.PKI.Cluster
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.CA = filepath.Join(c.PKI.Dir, pki.CACertFile)
	cfg.Curators = []string{c.Curators[0].Addr}
	cfg.NodeKey = keyFile
	cfg.RegisterTicket = encodeTicket(ticket.Ticket)
	cfg.Consensus = n.API
	cfg.Address = "127.0.0.1"
	cfg.Listen = proctest.FreeAddr(t)
	cfg.StatusInterval = 200 * time.Millisecond
	cfg.RetryMax = time.Second
	svc, err := roleserve.New(cfg, slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	if svc.NodeID() != a.ID {
		t.Fatalf("node id %s, want %s", svc.NodeID(), a.ID)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	rs := &agent{pki: c.PKI, dataDir: cfg.DataDir, listen: cfg.Listen}

	proctest.Eventually(t, time.Minute, func() error {
		_, err := c.Management().ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: a.ID})
		return err
	})
	rs.eventuallyStatus(t, "running without roles", func(st *roleservev1.GetStatusResponse) bool {
		return st.EnrolmentState == roleservev1.EnrolmentState_ENROLMENT_STATE_RUNNING && st.Launcher.GetPhase() == "left" &&
			st.ReportedStatus.GetConsensusPeerUrl() == n.PeerURL
	})
	updateRoles(t, c, a.ID, true)
	rs.eventuallyStatus(t, "running consensus", func(st *roleservev1.GetStatusResponse) bool {
		return st.Launcher.GetPhase() == "running" && running(st.Consensus) && st.Consensus.Learner
	})

	etcd := c.Etcd(c.Voters[0].ClientURL)
	record := nodeRecord(t, etcd, a.ID)
	withoutRole := proto.Clone(record).(*curatorv1.Node)
	withoutRole.Roles.ConsensusMember = nil
	putNodeRecord(t, etcd, withoutRole)
	rs.eventuallyStatus(t, "waiting to leave", func(st *roleservev1.GetStatusResponse) bool {
		return st.Launcher.GetPhase() == "leaving" && st.Launcher.GetAttempts() >= 2
	})
	putNodeRecord(t, etcd, record)
	rs.eventuallyStatus(t, "role back", func(st *roleservev1.GetStatusResponse) bool {
		return st.Launcher.GetPhase() == "running" && running(st.Consensus)
	})

	updateRoles(t, c, a.ID, false)
	rs.eventuallyStatus(t, "left", func(st *roleservev1.GetStatusResponse) bool {
		return st.Launcher.GetPhase() == "left" && st.Consensus.GetState() == consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE
	})
	if m := memberOf(c, a.ID); m != nil {
		t.Fatalf("still a member: %v", m)
	}
}

// encodeTicket is the ticket as the API shows it in JSON (base64), the form
// --register-ticket takes.
func encodeTicket(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
