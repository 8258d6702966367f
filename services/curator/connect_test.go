package curator_test

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/gen/curia/curator/v1/curatorv1connect"
	"curia.dev/platform/pki"
	cut "curia.dev/services/curator/curatortest"
)

// TestConnect: the admin API over the Connect protocol, with JSON as curl
// sends it, on the leader and on a follower, for admins only (and the
// reconciler's read of the cluster config).
func TestConnect(t *testing.T) {
	c := cut.New(t, 2)
	ctx := ctxT(t)
	httpClient := func(p pki.Principal) *http.Client {
		creds := c.PKI.Creds(t, p)
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: creds.CAPool, Certificates: []tls.Certificate{*creds.Certificate()}, ServerName: "localhost", MinVersion: tls.VersionTLS13,
		}}}
	}
	post := func(cl *http.Client, cur *cut.Curator, method, body string) (int, string) {
		resp, err := cl.Post("https://"+cur.HTTPAddr+"/curia.curator.v1.Management/"+method, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	admin := httpClient(cut.Admin)
	for _, cur := range c.Curators { // leader and follower alike
		code, body := post(admin, cur, "GetClusterInfo", "{}")
		var info map[string]any
		if code != http.StatusOK || json.Unmarshal([]byte(body), &info) != nil || info["clusterName"] != c.PKI.Cluster {
			t.Fatalf("%s: GetClusterInfo: %d %s", cur.Name, code, body)
		}
		// Server streaming through a Connect client.
		stream, err := curatorv1connect.NewManagementClient(admin, "https://"+cur.HTTPAddr).GetNodes(ctx, connect.NewRequest(&curatorv1.GetNodesRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		nodes := 0
		for stream.Receive() {
			nodes += len(stream.Msg().Nodes)
		}
		if stream.Err() != nil || nodes != 1 {
			t.Fatalf("%s: GetNodes over Connect: %d nodes, %v", cur.Name, nodes, stream.Err())
		}
	}
	// Errors keep their code and reason.
	if code, body := post(admin, c.Curators[0], "ApproveNode", `{"nodeId": "bob"}`); code != http.StatusBadRequest || !strings.Contains(body, "invalid_argument") {
		t.Fatalf("bad node id: %d %s", code, body)
	}
	// A write as curl sends it: the mask's JSON is one string of camelCase
	// paths.
	update := `{"config": {"paused": true, "pauseReason": "maintenance"}, "updateMask": "paused,pauseReason", "reason": "over curl"}`
	if code, body := post(admin, c.Curators[1], "UpdateClusterConfig", update); code != http.StatusOK ||
		!strings.Contains(body, `"paused":true`) || !strings.Contains(body, `"pauseReason":"maintenance"`) {
		t.Fatalf("UpdateClusterConfig: %d %s", code, body)
	}
	// Only admins, but for the reconciler's read of the cluster config.
	reconciler := httpClient(pki.Principal{Kind: pki.KindReconciler})
	if code, body := post(reconciler, c.Curators[0], "GetClusterInfo", "{}"); code != http.StatusForbidden {
		t.Fatalf("reconciler on the admin API: %d %s", code, body)
	}
	if code, body := post(reconciler, c.Curators[0], "UpdateClusterConfig", update); code != http.StatusForbidden {
		t.Fatalf("reconciler updates the cluster config: %d %s", code, body)
	}
	if code, body := post(reconciler, c.Curators[0], "GetClusterConfig", "{}"); code != http.StatusOK || !strings.Contains(body, `"pauseReason":"maintenance"`) {
		t.Fatalf("reconciler reads the cluster config: %d %s", code, body)
	}
	// And curl itself, when this machine has it.
	if curl, err := exec.LookPath("curl"); err == nil {
		files := c.PKI.Files(t, cut.Admin)
		out, err := exec.Command(curl, "-sS", "--fail", "--cacert", files.CA, "--cert", files.Cert, "--key", files.Key,
			"-H", "Content-Type: application/json", "-d", "{}",
			"https://localhost"+c.Curators[0].HTTPAddr[strings.LastIndex(c.Curators[0].HTTPAddr, ":"):]+"/curia.curator.v1.Management/GetClusterInfo").CombinedOutput()
		if err != nil || !strings.Contains(string(out), `"clusterName"`) {
			t.Fatalf("curl: %v\n%s", err, out)
		}
	}
}

// TestConnectListNodes: ListNodes over Connect with JSON, as curl sends it
// (the README's example), on the leader and on a follower: pages follow
// their token, BASIC carries no certificate bytes and FULL does, errors
// keep their code, and curl itself lists the nodes.
func TestConnectListNodes(t *testing.T) {
	c := cut.New(t, 2)
	cut.SeedNodes(t, c.Etcd(c.Voters[0].ClientURL), 3) // 4 nodes with the bootstrap node
	creds := c.PKI.Creds(t, cut.Admin)
	admin := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: creds.CAPool, Certificates: []tls.Certificate{*creds.Certificate()}, ServerName: "localhost", MinVersion: tls.VersionTLS13,
	}}}
	certBytes := regexp.MustCompile(`"(memberCertificate|caCertificate|crl)":"[^"]`)
	type page struct {
		Nodes []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"nodes"`
		NextPageToken string `json:"nextPageToken"`
	}
	post := func(cur *cut.Curator, body string) (int, string) {
		t.Helper()
		resp, err := admin.Post("https://"+cur.HTTPAddr+"/curia.curator.v1.Management/ListNodes", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, cur := range c.Curators { // leader and follower alike
		var ids []string
		body := `{"view":"NODE_VIEW_BASIC","pageSize":2}`
		for pages := 0; ; pages++ {
			code, out := post(cur, body)
			var p page
			if code != http.StatusOK || json.Unmarshal([]byte(out), &p) != nil || len(p.Nodes) == 0 {
				t.Fatalf("%s: ListNodes %s: %d %s", cur.Name, body, code, out)
			}
			// The JSON has every field, empty ones too ("memberCertificate": "").
			if certBytes.MatchString(out) {
				t.Fatalf("%s: a BASIC page carries certificates: %s", cur.Name, out)
			}
			for _, n := range p.Nodes {
				ids = append(ids, n.ID)
				if n.State != "NODE_STATE_UP" {
					t.Fatalf("%s: node %s is %q", cur.Name, n.ID, n.State)
				}
			}
			if p.NextPageToken == "" {
				break
			}
			if pages > 2 {
				t.Fatalf("%s: more than 2 pages of 2 for 4 nodes: %v", cur.Name, ids)
			}
			body = `{"view":"NODE_VIEW_BASIC","pageSize":2,"pageToken":"` + p.NextPageToken + `"}`
		}
		if len(ids) != 4 || !slices.IsSorted(ids) {
			t.Fatalf("%s: listed %v, want the 4 nodes in id order", cur.Name, ids)
		}
		code, out := post(cur, `{"view":"NODE_VIEW_FULL","filter":"has(node.roles.consensus_member)"}`)
		if code != http.StatusOK || !strings.Contains(out, `"memberCertificate":"LS0t`) || !strings.Contains(out, `"caCertificate":"LS0t`) { // base64 of "---"
			t.Fatalf("%s: FULL: %d %s", cur.Name, code, out)
		}
		for _, bad := range []string{`{"pageSize":1001}`, `{"pageToken":"nope"}`} {
			if code, out := post(cur, bad); code != http.StatusBadRequest || !strings.Contains(out, "invalid_argument") {
				t.Fatalf("%s: %s: %d %s", cur.Name, bad, code, out)
			}
		}
	}
	// curl itself, exactly as the README has it, when this machine has it.
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Log("no curl on this machine: the HTTP client above stood in for it")
		return
	}
	files := c.PKI.Files(t, cut.Admin)
	addr := c.Curators[1].HTTPAddr
	out, err := exec.Command(curl, "-sS", "--fail", "--cacert", files.CA, "--cert", files.Cert, "--key", files.Key,
		"-H", "Content-Type: application/json", "-d", `{"view":"NODE_VIEW_BASIC","pageSize":2}`,
		"https://localhost"+addr[strings.LastIndex(addr, ":"):]+"/curia.curator.v1.Management/ListNodes").CombinedOutput()
	var p page
	if err != nil || json.Unmarshal(out, &p) != nil || len(p.Nodes) != 2 || p.NextPageToken == "" {
		t.Fatalf("curl: %v\n%s", err, out)
	}
}
