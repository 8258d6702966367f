//go:build e2e

package local_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/proctest"
)

// dashboardScenario drives the dashboard (curia-dashboard) in Debian's
// chromium, headless, against the process cluster, as an operator would:
// the membership page shows the three voters; giving the worker
// ConsensusMember from the nodes page makes it a learner, then a voter, on
// the page without a reload; an action the API refuses shows its message;
// the membership timeline shows the cluster's formation (node-2 and node-3
// added as learners and promoted), the failure tolerance chart has
// points, and a voter put into maintenance is on the pages until its
// maintenance ends. It leaves the cluster as it found it (node-1..3
// voters, control_plane_size 3, no node in maintenance) and a screenshot
// of each page (the directory is in the log).
func dashboardScenario(t *testing.T, c *cluster) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("no chromium on PATH: apt-get install chromium (.ci/run installs it when missing)")
	}
	shots := screenshotDir(t)
	url := startDashboard(t, c)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1600, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 8*time.Minute)
	defer cancel()
	do := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// click clicks the element sel names, and clears the page's last
	// answer (#result) first, so that the answer awaited after it
	// (act) is this click's. The click is the element's own (the DOM's
	// click(): what a mouse click on it does), not a mouse event at its
	// coordinates: the pages re-render their rows on live updates, and a
	// mouse event sent after a re-render moved the element lands on
	// whatever is there then, which does nothing the test can see.
	click := func(what, sel string) {
		t.Helper()
		js := fmt.Sprintf(`(e => { if (!e) return 'no element'; const r = document.getElementById('result'); r.className = ''; r.textContent = ''; e.click(); return 'clicked' })(document.querySelector(%q))`, sel)
		proctest.Eventually(t, 30*time.Second, func() error {
			got, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			if got != "clicked" {
				return fmt.Errorf("%s: %s matches %s", what, sel, got)
			}
			return nil
		})
	}
	// act clicks the button sel names and waits for the page's answer
	// (#result); it fails, with the answer's text, unless the answer's
	// class is want ("ok" or "refused"). An answer of Unavailable or Aborted
	// (the API says: retry; a membership change in flight is Aborted) is
	// clicked again, as an operator would, twice at most.
	act := func(what, sel, want string) string {
		t.Helper()
		var class, text string
		for attempt := 1; ; attempt++ {
			click(what, sel)
			proctest.Eventually(t, 30*time.Second, func() error {
				got, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(r => [r.className, r.textContent])(document.getElementById('result'))`))
				if err != nil {
					return err
				}
				if class, text = got[0], got[1]; class == "" {
					return fmt.Errorf("%s: no answer on the page yet", what)
				}
				return nil
			})
			retry := strings.HasPrefix(text, codes.Unavailable.String()+": ") || strings.HasPrefix(text, codes.Aborted.String()+": ")
			if attempt == 3 || !retry {
				break
			}
			t.Logf("%s: the page answered %q; again", what, text)
		}
		if class != want {
			t.Fatalf("%s: the page answered %s %q, want %s", what, class, text, want)
		}
		return text
	}
	// eval polls a JavaScript expression until it returns want.
	eval := func(timeout time.Duration, expr, want string) {
		t.Helper()
		proctest.Eventually(t, timeout, func() error {
			got, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("%s = %q, want %q", expr, got, want)
			}
			return nil
		})
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	worker, boot := c.ids["node-4"], c.ids["node-1"]
	membership := func(id string) string {
		return fmt.Sprintf(`(document.querySelector('#nodes tr[data-node=%q] .membership') || {textContent: 'no row'}).textContent`, id)
	}

	// The membership page after make run: three voters, one leads.
	do("open the membership page", chromedp.Navigate(url+"/membership"))
	eval(time.Minute, `String(document.querySelectorAll('#members .member.voter').length)`, "3")
	eval(time.Minute, `String(document.querySelectorAll('#members .member.leader').length)`, "1")
	eval(time.Minute, `String(document.querySelectorAll('#members .member.learner').length)`, "0")
	shot("membership")

	do("open the cluster page", chromedp.Navigate(url+"/"))
	eval(time.Minute, `document.getElementById('voters').textContent.split(',')[0]`, "3 voters")
	eval(time.Minute, `document.getElementById('tolerance').textContent`, "survives 1 voter failure")
	eval(time.Minute, `String(document.getElementById('reconciler').textContent.startsWith('reconciler-'))`, "true")
	shot("cluster")

	// Autopilot would undo a hand-made change: manual first.
	setSize(t, c, 0)
	do("open the nodes page", chromedp.Navigate(url+"/nodes"))
	eval(time.Minute, membership(worker), "")
	eval(5*time.Second, `window.curiaLoaded = 'once'`, "once")
	act("give the worker ConsensusMember", fmt.Sprintf(`#nodes tr[data-node=%q] button[name="give-cm"]`, worker), "ok")
	// Learner, then voter: every state the row goes through, as the page
	// shows it.
	// Meanwhile /api/membership tells the learner's catch-up (when a poll
	// lands while it is one: it may be promoted within a second).
	var seen []string
	var caughtUp []learnerJSON
	proctest.Eventually(t, 3*time.Minute, func() error {
		caughtUp = append(caughtUp, learnersOf(t, url, worker)...)
		m, err := chromedp.Run(ctx, chromedp.Evaluate[string](membership(worker)))
		if err != nil {
			return err
		}
		if len(seen) == 0 || seen[len(seen)-1] != m {
			seen = append(seen, m)
			if m == "learner" {
				shot("nodes-learner")
			}
		}
		if m != "voter" {
			return fmt.Errorf("the worker's row says %q (so far %q)", m, seen)
		}
		return nil
	})
	if !slices.Contains(seen, "learner") {
		t.Fatalf("the worker became a voter without the page showing it a learner: %q", seen)
	}
	eval(time.Second*5, `window.curiaLoaded`, "once") // no reload
	t.Logf("the worker's membership on the page: %q", seen)
	for _, l := range caughtUp {
		if l.SinceFrom != "audit log" && l.SinceFrom != "dashboard" {
			t.Errorf("the learner's since_from %q, want audit log or dashboard: %+v", l.SinceFrom, l)
		}
		if l.Answered && (l.RaftIndex == 0 || l.LeaderRaftIndex == 0 || l.Percent > 100) {
			t.Errorf("a learner that answered has no raft index, or the leader none: %+v", l)
		}
	}
	if len(caughtUp) == 0 {
		t.Fatal("/api/membership never listed the worker as a learner while the page showed it one")
	}
	t.Logf("the worker as a learner on /api/membership: %d polls, the last %+v", len(caughtUp), caughtUp[len(caughtUp)-1])
	shot("nodes")

	// Refused: deleting the bootstrap node, UP and with roles, without a
	// bypass. The page shows what the API says.
	var apiErr error
	proctest.Eventually(t, 30*time.Second, func() error { // the refusal, not a moment's UNAVAILABLE
		_, apiErr = c.mgmt().DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: boot})
		if apiErr == nil {
			t.Fatal("DeleteNode of node-1 without bypass succeeded")
		}
		if status.Code(apiErr) != codes.FailedPrecondition {
			return apiErr
		}
		return nil
	})
	click("open deleting node-1", fmt.Sprintf(`#delete-%s summary`, boot))
	click("confirm deleting node-1", fmt.Sprintf(`#delete-%s input[name="confirm"]`, boot))
	// The API's code and message, once each, as they are: no prefix of
	// the page's own.
	st := status.Convert(apiErr)
	if got, want := act("delete node-1", fmt.Sprintf(`#delete-%s button[name="delete"]`, boot), "refused"), st.Code().String()+": "+st.Message(); got != want {
		t.Fatalf("the page says %q, the API said %q", got, want)
	}
	shot("nodes-refused")

	// Back as it was: the worker's role taken from the page, autopilot on.
	act("take ConsensusMember from the worker", fmt.Sprintf(`#nodes tr[data-node=%q] button[name="take-cm"]`, worker), "ok")
	eval(3*time.Minute, membership(worker), "")
	setSize(t, c, 3)
	c.eventuallyAgree()

	do("open the audit log", chromedp.Navigate(url+"/audit"))
	// Newest first, and the page's own actions are there, by the admin.
	eval(time.Minute, `(r => String(r.length > 1 && r.every((x, i) => i == 0 || +r[i-1] >= +x)))([...document.querySelectorAll('#audit tbody tr')].map(tr => tr.dataset.revision))`, "true")
	eval(time.Minute, `String([...document.querySelectorAll('#audit tbody tr')].some(tr => tr.children[1].textContent === 'admin/admin' && tr.children[2].textContent === 'ROLES_UPDATE'))`, "true")
	shot("audit")

	// The membership timeline, from the audit log: the cluster's
	// formation, newest first, and the worker's add and removal above.
	do("open the membership page", chromedp.Navigate(url+"/membership"))
	timeline := func(action, node, outcome string) string {
		return fmt.Sprintf(`String(document.querySelectorAll('#timeline tr[data-action=%q][data-node=%q][data-outcome=%q]').length > 0)`, action, node, outcome)
	}
	for _, node := range []string{"node-2", "node-3"} {
		eval(time.Minute, timeline("MEMBER_ADD", c.ids[node], "APPLIED"), "true")
		eval(5*time.Second, timeline("MEMBER_PROMOTE", c.ids[node], "APPLIED"), "true")
	}
	eval(5*time.Second, timeline("CLUSTER_BOOTSTRAP", boot, "done"), "true")
	eval(5*time.Second, timeline("MEMBER_REMOVE", worker, "APPLIED"), "true")
	eval(5*time.Second, `(r => String(r.length > 1 && r.every((x, i) => i == 0 || +r[i-1] >= +x)))([...document.querySelectorAll('#timeline tbody tr')].map(tr => tr.dataset.revision))`, "true")
	eval(5*time.Second, `document.querySelector('#learners tbody').textContent.trim()`, "no learner: every member votes")
	// The failure tolerance chart: samples, and a line through them.
	eval(time.Minute, `String(+document.getElementById('tolerance-chart').dataset.samples > 0 && document.querySelector('#tolerance-chart polyline.tolerance').getAttribute('points').trim().split(' ').length >= 2)`, "true")
	shot("membership-timeline")

	// A voter in maintenance: the cluster page says so, with why, by whom
	// and until when; the nodes page marks its row; the timeline has it.
	voter := c.ids["node-2"]
	mctx, mcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer mcancel()
	t.Cleanup(func() {
		ectx, ecancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ecancel()
		if _, err := c.mgmt().EndNodeMaintenance(ectx, &curatorv1.EndNodeMaintenanceRequest{NodeId: voter}); err != nil {
			t.Errorf("end node-2's maintenance: %v", err)
		}
	})
	proctest.Eventually(t, time.Minute, func() error { // refused while a change is pending
		_, err := c.mgmt().StartNodeMaintenance(mctx, &curatorv1.StartNodeMaintenanceRequest{NodeId: voter, Reason: "e2e: the dashboard shows it", Duration: durationpb.New(5 * time.Minute)})
		return err
	})
	do("open the cluster page", chromedp.Navigate(url+"/"))
	inMaintenance := fmt.Sprintf(`#maintenance .maintenance-node[data-node=%q]`, voter)
	eval(time.Minute, `String(document.querySelector('`+inMaintenance+`') !== null)`, "true")
	eval(5*time.Second, `document.querySelector('`+inMaintenance+`').dataset.voter`, "true")
	eval(5*time.Second, `String(document.querySelector('`+inMaintenance+`').textContent.includes('A voter is in maintenance'))`, "true")
	eval(5*time.Second, `document.querySelector('`+inMaintenance+` .reason').textContent`, "e2e: the dashboard shows it")
	eval(5*time.Second, `document.querySelector('`+inMaintenance+` .by').textContent`, "admin/admin")
	shot("cluster-maintenance")
	do("open the nodes page", chromedp.Navigate(url+"/nodes"))
	eval(30*time.Second, fmt.Sprintf(`String(document.querySelector('#nodes tr[data-node=%q] .maintenance') !== null)`, voter), "true")
	do("open the membership page", chromedp.Navigate(url+"/membership"))
	eval(30*time.Second, `String(document.querySelector('`+inMaintenance+`') !== null)`, "true")
	eval(30*time.Second, timeline("NODE_MAINTENANCE_START", voter, "done"), "true")
	if _, err := c.mgmt().EndNodeMaintenance(mctx, &curatorv1.EndNodeMaintenanceRequest{NodeId: voter}); err != nil {
		t.Fatal(err)
	}
	// Live: gone from the page without a reload, and on the timeline.
	eval(30*time.Second, `String(document.querySelector('`+inMaintenance+`') === null)`, "true")
	eval(30*time.Second, timeline("NODE_MAINTENANCE_END", voter, "done"), "true")
	shot("membership-maintenance-ended")
	c.eventuallyAgree()
	t.Logf("screenshots in %s", shots)
}

// learnerJSON is a learner as GET /api/membership says it.
type learnerJSON struct {
	Node            string
	RaftIndex       uint64 `json:"raft_index"`
	LeaderRaftIndex uint64 `json:"leader_raft_index"`
	Lag             uint64
	Percent         int
	Answered        bool
	SinceFrom       string `json:"since_from"`
}

// learnersOf is node's learner rows of GET /api/membership (none when the
// dashboard does not answer).
func learnersOf(t *testing.T, url, node string) []learnerJSON {
	code, body, err := proctest.Get(url + "/api/membership")
	if err != nil || code != http.StatusOK {
		return nil
	}
	var m struct{ Learners []learnerJSON }
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("GET /api/membership: %v:\n%s", err, body)
	}
	var out []learnerJSON
	for _, l := range m.Learners {
		if l.Node == node {
			out = append(out, l)
		}
	}
	return out
}

// startDashboard runs curia-dashboard against the cluster, with the
// admin's credentials of its env file, and returns its URL.
func startDashboard(t *testing.T, c *cluster) string {
	addr := proctest.FreeAddr(t)
	p := proctest.New(t, "curia-dashboard", proctest.Build(t, "curia.dev/services/dashboard/cmd/curia-dashboard"),
		"--ca", c.env["CURIA_CACERT"], "--cert", c.env["CURIA_ADMIN_CERT"], "--key", c.env["CURIA_ADMIN_KEY"],
		"--listen", addr, "--curator", c.env["CURIA_CURATORS"], "--reconciler", c.env["CURIA_RECONCILERS"])
	p.Start()
	url := "http://" + addr
	proctest.Eventually(t, 30*time.Second, func() error {
		code, _, err := proctest.Get(url + "/")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("GET /: %d", code)
		}
		return err
	})
	return url
}

func setSize(t *testing.T, c *cluster, size uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.mgmt().UpdateClusterConfig(ctx, &curatorv1.UpdateClusterConfigRequest{
		Config: &curatorv1.ClusterConfig{ControlPlaneSize: size}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"control_plane_size"}}, Reason: "e2e: the dashboard",
	}); err != nil {
		t.Fatal(err)
	}
}

// screenshotDir is the test's artifact directory with -artifacts (kept in
// -outputdir), else a directory kept after the test.
func screenshotDir(t *testing.T) string {
	if f := flag.Lookup("test.artifacts"); f != nil && f.Value.String() == "true" {
		return t.ArtifactDir()
	}
	dir, err := os.MkdirTemp("", "curia-e2e-dashboard-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
