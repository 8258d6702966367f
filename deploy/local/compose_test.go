package local

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"curia.dev/platform/pki"
)

// The compose file names node files by node name (nodeN.ed25519.key,
// nodeN-consensus.crt, ...); curia-local pki --compose makes those names.
func TestComposeStableNames(t *testing.T) {
	state := t.TempDir()
	cfg := Config{State: state, Cluster: "curia", ControlPlane: 3, Workers: 1, Curators: 2, Reconcilers: 2, Compose: true,
		Out: io.Discard, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c := New(cfg)
	if err := c.PKI(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(state, "pki")
	same := func(a, b string) {
		t.Helper()
		x, err := os.ReadFile(filepath.Join(dir, a))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(dir, b))
		if err != nil {
			t.Fatal(err)
		}
		if string(x) != string(y) {
			t.Errorf("%s and %s differ", a, b)
		}
	}
	for i, n := range c.Nodes {
		if !strings.HasPrefix(n.ID, "node-") {
			t.Fatalf("%s: id %q", n.Name, n.ID)
		}
		same(n.Name+".ed25519.key", pki.NodeKeyFile(n.ID))
		same(n.Name+"-consensus.crt", "consensus-"+n.ID+".crt")
		same(n.Name+"-consensus.key", "consensus-"+n.ID+".key")
		_, err := os.Lstat(filepath.Join(dir, n.Name+".crt"))
		if i == 0 {
			same(n.Name+".crt", n.ID+".crt")
			same(n.Name+".key", n.ID+".key")
		} else if err == nil {
			t.Errorf("%s.crt exists: only the bootstrap node has a node certificate", n.Name)
		}
	}

	// A second run (compose's pki service on every `up`) keeps the PKI and
	// the links, and repairs a broken one.
	if err := os.Remove(filepath.Join(dir, "node2.ed25519.key")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("elsewhere", filepath.Join(dir, "node3.ed25519.key.new")); err != nil {
		t.Fatal(err)
	}
	os.Rename(filepath.Join(dir, "node3.ed25519.key.new"), filepath.Join(dir, "node3.ed25519.key"))
	ids := []string{c.Nodes[0].ID, c.Nodes[1].ID}
	c = New(cfg)
	if err := c.PKI(); err != nil {
		t.Fatal(err)
	}
	if c.Nodes[0].ID != ids[0] || c.Nodes[1].ID != ids[1] {
		t.Errorf("ids changed: %s %s, were %v", c.Nodes[0].ID, c.Nodes[1].ID, ids)
	}
	same("node2.ed25519.key", pki.NodeKeyFile(c.Nodes[1].ID))
	same("node3.ed25519.key", pki.NodeKeyFile(c.Nodes[2].ID))

	// Outside compose nothing is linked.
	plain := t.TempDir()
	if err := New(Config{State: plain, Cluster: "curia", ControlPlane: 1, Curators: 1, Reconcilers: 1, Out: io.Discard}).PKI(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(plain, "pki", "node-1.ed25519.key")); err == nil {
		t.Error("process cluster: stable names made outside compose")
	}
}
