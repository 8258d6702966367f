package dashboard_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	cut "curia.dev/services/curator/curatortest"
	"curia.dev/services/dashboard"
)

func TestListenOnlyOnLoopback(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:7000":   true,
		"127.0.0.99:0":     true,
		"[::1]:7000":       true,
		"localhost:7000":   true,
		":7000":            false, // every interface
		"0.0.0.0:7000":     false,
		"[::]:7000":        false,
		"10.0.0.5:7000":    false,
		"192.168.1.1:7000": false,
		"example.com:7000": false,
		"127.0.0.1":        false, // no port
	} {
		t.Run(addr, func(t *testing.T) {
			err := dashboard.CheckLoopback(addr)
			if ok && err != nil {
				t.Fatalf("CheckLoopback(%q) = %v, want nil", addr, err)
			}
			if !ok && err == nil {
				t.Fatalf("CheckLoopback(%q) = nil, want a refusal", addr)
			}
		})
	}
	// New refuses it before it reads a credential or listens.
	cfg := dashboard.DefaultConfig()
	cfg.Listen, cfg.Curators = "0.0.0.0:7000", []string{"127.0.0.1:7200"}
	cfg.TLS.CA, cfg.TLS.Cert, cfg.TLS.Key = "ca", "cert", "key"
	if _, err := dashboard.New(cfg, slog.New(slog.DiscardHandler)); !errors.Is(err, dashboard.ErrNotLoopback) {
		t.Fatalf("New with --listen 0.0.0.0:7000 = %v, want ErrNotLoopback", err)
	}
}

// env is a control plane of real processes (consensus, two curators, a
// reconciler) and a dashboard in the test's process.
type env struct {
	t testing.TB
	c *cut.Cluster
	d *dashboard.Dashboard
}

func newEnv(t testing.TB) *env {
	t.Helper()
	proctest.SkipShort(t)
	c := cut.New(t, 2)
	rec := startReconciler(t, c)
	var curators []string
	for _, cur := range c.Curators {
		curators = append(curators, cur.Addr)
	}
	return &env{t: t, c: c, d: startDashboard(t, c, curators, []string{rec})}
}

func startDashboard(t testing.TB, c *cut.Cluster, curators, reconcilers []string) *dashboard.Dashboard {
	t.Helper()
	cfg := dashboard.DefaultConfig()
	cfg.Cluster = c.PKI.Cluster
	cfg.TLS = c.PKI.Files(t, cut.Admin)
	cfg.Listen = "127.0.0.1:0"
	cfg.Curators, cfg.Reconcilers = curators, reconcilers
	cfg.Refresh = 500 * time.Millisecond
	d, err := dashboard.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dashboard: %v", err)
		}
	})
	return d
}

// startReconciler starts a reconciler process and returns its address.
func startReconciler(t testing.TB, c *cut.Cluster) string {
	t.Helper()
	files := c.PKI.Files(t, pki.Principal{Kind: pki.KindReconciler})
	var curators, consensus []string
	for _, cur := range c.Curators {
		curators = append(curators, cur.Addr)
	}
	for _, v := range c.Voters {
		consensus = append(consensus, v.API)
	}
	addr := proctest.FreeAddr(t)
	p := proctest.New(t, "reconciler-1", proctest.Build(t, "curia.dev/services/reconciler/cmd/reconciler"),
		"--cluster", c.PKI.Cluster, "--name", "reconciler-1",
		"--ca", files.CA, "--cert", files.Cert, "--key", files.Key,
		"--listen", addr,
		"--curator", strings.Join(curators, ","),
		"--consensus", strings.Join(consensus, ","),
		"--lease-ttl", "3s", "--tick", "500ms")
	p.Start()
	return addr
}

// get fetches a page and returns its body.
func (e *env) get(path string) (int, string) {
	e.t.Helper()
	resp, err := http.Get(e.d.URL() + path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// token is the page token, as a page carries it.
func (e *env) token() string {
	e.t.Helper()
	_, body := e.get("/")
	m := regexp.MustCompile(`name="curia-token" content="([0-9a-f]+)"`).FindStringSubmatch(body)
	if m == nil {
		e.t.Fatal("no token on the page")
	}
	return m[1]
}

// getJSON fetches path and decodes its JSON into v.
func (e *env) getJSON(path string, v any) {
	e.t.Helper()
	code, body := e.get(path)
	if code != http.StatusOK {
		e.t.Fatalf("GET %s: %d %s", path, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		e.t.Fatalf("GET %s: %v:\n%s", path, err, body)
	}
}

// post sends an admin action as the page's script does.
func (e *env) post(path, token string, form url.Values) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.d.URL()+path, strings.NewReader(form.Encode()))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if token != "" {
		req.Header.Set("X-Curia-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// eventually waits until the page at path contains every string of want.
func (e *env) eventually(path string, want ...string) string {
	e.t.Helper()
	var body string
	proctest.Eventually(e.t, 30*time.Second, func() error {
		var code int
		code, body = e.get(path)
		if code != http.StatusOK {
			return fmt.Errorf("GET %s: %d %s", path, code, body)
		}
		for _, w := range want {
			if !strings.Contains(body, w) {
				return fmt.Errorf("GET %s has no %q:\n%s", path, w, body)
			}
		}
		return nil
	})
	return body
}

// register registers a new node with the ticket: it waits, NEW, for an
// admin's approval.
func register(t testing.TB, c *cut.Cluster) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ticket, err := c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	if err != nil {
		t.Fatal(err)
	}
	a := c.NewAgent()
	if _, err := a.Enrolling(c.Running()).RegisterNode(ctx, &curatorv1.RegisterNodeRequest{RegisterTicket: ticket.Ticket, PublicKey: a.Key.Public().(ed25519.PublicKey)}); err != nil {
		t.Fatal(err)
	}
	return a.ID
}

// TestDashboard drives the pages as an operator would, against real
// processes: what each page shows, that an action changes what a page
// shows, live, and that a refused action shows the API's message.
func TestDashboard(t *testing.T) {
	e := newEnv(t)
	c := e.c
	boot := c.Voters[0].ID
	leader := c.Leader()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stream, err := curatorv1.NewCuratorClient(c.Conn(leader, cut.Admin)).GetCurrentLeader(ctx, &curatorv1.GetCurrentLeaderRequest{})
	if err != nil {
		t.Fatal(err)
	}
	lead, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("cluster", func(t *testing.T) {
		e.eventually("/",
			fmt.Sprintf(`id="leader">%s, term %d`, lead.LeaderName, lead.Term),
			`id="reconciler">reconciler-1, lease until `, `reconciler-1/`,
			`id="voters">1 voters, 1 healthy, quorum 1`,
			`id="tolerance" class="warn">survives 0 voter failures`,
			`id="pending">none`,
			`id="cluster-name">`+c.PKI.Cluster+`<`)
	})

	t.Run("nodes", func(t *testing.T) {
		body := e.eventually("/nodes", `id="node-`+boot+`"`)
		row := rowOf(t, body, boot)
		for _, want := range []string{`class="state">UP<`, `class="health UNKNOWN">UNKNOWN<`, `>never<` /* no agent heartbeats here */, "ConsensusMember", `class="membership">voter (leader)<`, "Take ConsensusMember"} {
			if !strings.Contains(row, want) {
				t.Errorf("bootstrap node's row has no %q:\n%s", want, row)
			}
		}
	})

	// An event stream of the nodes page, opened before the change: the
	// change must arrive on it, without a new request.
	events := e.events(ctx, "nodes", "")
	id := register(t, c)

	t.Run("approve", func(t *testing.T) {
		e.waitEvent(events, `id="node-`+id+`"`, `class="state">NEW<`)
		row := rowOf(t, e.eventually("/nodes", `id="node-`+id+`"`), id)
		if !strings.Contains(row, `name="approve"`) {
			t.Fatalf("a NEW node's row has no Approve button:\n%s", row)
		}
		code, msg := e.post("/api/approve", e.token(), url.Values{"node_id": {id}})
		if code != http.StatusOK || msg != "approved "+id {
			t.Fatalf("approve: %d %q", code, msg)
		}
		e.waitEvent(events, `id="node-`+id+`"`, `class="state">STANDBY<`)
	})

	t.Run("filter", func(t *testing.T) {
		body := e.eventually("/nodes?filter="+url.QueryEscape("node.state == NODE_STATE_STANDBY"), `id="node-`+id+`"`, "1 matching of 2 nodes")
		if strings.Contains(body, `id="node-`+boot+`"`) {
			t.Fatal("the filter for STANDBY nodes lists the UP bootstrap node")
		}
		_, body = e.get("/nodes?filter=" + url.QueryEscape("node.nope =="))
		if !regexp.MustCompile(`id="filter-error">InvalidArgument: `).MatchString(body) {
			t.Fatalf("a filter that does not compile shows no InvalidArgument:\n%s", body)
		}
	})

	t.Run("refused action shows the API's message", func(t *testing.T) {
		// What the API says to deleting the bootstrap node, UP with roles,
		// without a bypass.
		_, err := c.Management().DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: boot})
		st, ok := status.FromError(err)
		if err == nil || !ok {
			t.Fatalf("DeleteNode without bypass = %v, want a refusal", err)
		}
		code, msg := e.post("/api/delete", e.token(), url.Values{"node_id": {boot}, "confirm": {boot}})
		if want := st.Code().String() + ": " + st.Message(); code != http.StatusConflict || msg != want {
			t.Fatalf("delete without bypass: %d %q, want 409 %q", code, msg, want)
		}
		// Not confirmed: nothing is asked.
		code, msg = e.post("/api/delete", e.token(), url.Values{"node_id": {boot}, "bypass_has_roles": {"on"}, "bypass_not_decommissioned": {"on"}})
		if code != http.StatusBadRequest || !strings.Contains(msg, "not confirmed") {
			t.Fatalf("delete without confirmation: %d %q", code, msg)
		}
		e.eventually("/nodes", `id="node-`+boot+`"`)
	})

	t.Run("writes need the page token and reads the dashboard's own host", func(t *testing.T) {
		if code, msg := e.post("/api/approve", "", url.Values{"node_id": {id}}); code != http.StatusForbidden {
			t.Fatalf("approve without the page token: %d %q, want 403", code, msg)
		}
		if code, msg := e.post("/api/approve", strings.Repeat("0", 64), url.Values{"node_id": {id}}); code != http.StatusForbidden {
			t.Fatalf("approve with a wrong token: %d %q, want 403", code, msg)
		}
		req, _ := http.NewRequest(http.MethodGet, e.d.URL()+"/nodes", nil)
		req.Host = "attacker.example:7000"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("GET with Host attacker.example: %d, want 403", resp.StatusCode)
		}
	})

	t.Run("membership", func(t *testing.T) {
		e.eventually("/membership", `data-node="`+boot+`" data-membership="voter"`, "★ leader", `id="plan-next">Next: nothing to do`)
	})

	t.Run("timeline, chart and their JSON", func(t *testing.T) {
		// The bootstrap and the approval are on the membership timeline,
		// newest first; the status polled so far is on the chart.
		body := e.eventually("/membership", `id="timeline"`, `data-action="NODE_APPROVE" data-node="`+id+`" data-outcome="done"`,
			`data-action="CLUSTER_BOOTSTRAP"`, `id="learners"`, "no learner: every member votes")
		if a, b := strings.Index(body, `data-action="NODE_APPROVE"`), strings.Index(body, `data-action="CLUSTER_BOOTSTRAP"`); a > b {
			t.Fatal("the timeline is not newest first: the bootstrap comes before the approval")
		}
		e.eventually("/", `id="tolerance-chart" class="chart" data-samples="`, `<polyline class="tolerance" points="`)
		var tl struct {
			Timeline []struct{ Action, Node, Outcome, Actor string }
		}
		e.getJSON("/api/timeline?limit=1", &tl)
		if len(tl.Timeline) != 1 || tl.Timeline[0].Action != "NODE_APPROVE" || tl.Timeline[0].Node != id || tl.Timeline[0].Actor != "admin/test" {
			t.Fatalf("/api/timeline?limit=1 = %+v, want the approval of %s by admin/test", tl, id)
		}
		var tol struct {
			Period, Window string
			Samples        []struct {
				Voters           uint32
				FailureTolerance int32 `json:"failure_tolerance"`
			}
		}
		e.getJSON("/api/tolerance", &tol)
		if len(tol.Samples) == 0 || tol.Samples[len(tol.Samples)-1].Voters != 1 || tol.Window != "1h0m0s" {
			t.Fatalf("/api/tolerance = %+v, want samples of 1 voter over 1h", tol)
		}
		var m struct {
			Learners, Maintenance []any
			VoterInMaintenance    bool `json:"voter_in_maintenance"`
		}
		e.getJSON("/api/membership", &m)
		if m.Learners == nil || len(m.Learners) != 0 || m.Maintenance == nil || m.VoterInMaintenance {
			t.Fatalf("/api/membership = %+v, want no learner, no maintenance (as [])", m)
		}
		if code, _ := e.get("/api/timeline?limit=x"); code != http.StatusBadRequest {
			t.Fatalf("/api/timeline?limit=x: %d, want 400", code)
		}
	})

	t.Run("audit", func(t *testing.T) {
		body := e.eventually("/audit", ">NODE_APPROVE<", ">admin/test<", ">CLUSTER_BOOTSTRAP<")
		if a, b := strings.Index(body, ">NODE_APPROVE<"), strings.Index(body, ">CLUSTER_BOOTSTRAP<"); a > b {
			t.Fatal("the audit log is not newest first: the bootstrap comes before the approval")
		}
	})
}

// rowOf is the nodes table's row of a node.
func rowOf(t testing.TB, body, id string) string {
	t.Helper()
	i := strings.Index(body, `<tr id="node-`+id+`"`)
	if i < 0 {
		t.Fatalf("no row of %s:\n%s", id, body)
	}
	j := strings.Index(body[i:], "</tr>")
	return body[i : i+j]
}

// events opens a page's event stream; the channel carries each event's
// data.
func (e *env) events(ctx context.Context, page, filter string) <-chan string {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.d.URL()+"/events?page="+page+"&filter="+url.QueryEscape(filter), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		e.t.Fatalf("event stream's Content-Type %q", ct)
	}
	out := make(chan string, 100)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<22)
		var data []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "data: "):
				data = append(data, strings.TrimPrefix(line, "data: "))
			case line == "" && data != nil:
				out <- strings.Join(data, "\n")
				data = nil
			}
		}
	}()
	e.t.Cleanup(func() {
		for range out { //nolint:revive // drain until the stream ends
		}
	})
	return out
}

// waitEvent waits for an event whose data contains every string of want
// (within one table row, when the first names a row).
func (e *env) waitEvent(events <-chan string, want ...string) {
	e.t.Helper()
	timeout := time.After(30 * time.Second)
	var last string
	for {
		select {
		case data, ok := <-events:
			if !ok {
				e.t.Fatalf("event stream ended; last event:\n%s", last)
			}
			last = data
			if i := strings.Index(data, want[0]); i >= 0 {
				row := data[i:]
				if j := strings.Index(row, "</tr>"); j >= 0 {
					row = row[:j]
				}
				if all(row, want[1:]) {
					return
				}
			}
		case <-timeout:
			e.t.Fatalf("no event with %q within 30s; last event:\n%s", want, last)
		}
	}
}

func all(s string, want []string) bool {
	for _, w := range want {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}
