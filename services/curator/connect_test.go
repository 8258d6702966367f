package curator_test

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
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
