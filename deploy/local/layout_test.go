package local

import (
	"bytes"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLayout: every identity's directory holds its own files and nothing
// else, keys 0600 in 0700 directories; the CA key is only in pki/ and the
// curators'; a second run keeps the PKI; a state directory of the old,
// shared layout is refused with what to do.
func TestLayout(t *testing.T) {
	state := t.TempDir()
	cfg := Config{State: state, Cluster: "curia", ControlPlane: 3, Workers: 1, Curators: 2, Reconcilers: 2,
		Out: io.Discard, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c := New(cfg)
	if err := c.PKI(); err != nil {
		t.Fatal(err)
	}
	// The deployment issues the CA's, the admin's, the curators', the
	// reconcilers' and the bootstrap node's material, nothing else: every
	// other node has only its agent's key (the curator certifies it when
	// it enrols), and its consensus process makes its own key.
	want := map[string][]string{
		"admin":            {"tls.crt", "tls.key"},
		"curator":          {"ca.key", "tls.crt", "tls.key"},
		"reconciler":       {"tls.crt", "tls.key"},
		"node-1":           {"bootstrap.crt", "node.key"},
		"node-1-consensus": {"member.crt", "tls.crt", "tls.key"},
	}
	for _, n := range c.Nodes {
		if !strings.HasPrefix(n.ID, "node-") {
			t.Fatalf("%s: id %q", n.Name, n.ID)
		}
		if n.Name != "node-1" {
			want[n.Name] = []string{"node.key"}
		}
	}
	if got := c.Identities(); len(got) != len(want) {
		t.Fatalf("identities %v, want %d", got, len(want))
	}
	caKey, err := os.ReadFile(filepath.Join(state, "pki", "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	for id, files := range want {
		dir := filepath.Join(state, "secrets", id)
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, want 0700", dir, st.Mode().Perm())
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			got = append(got, e.Name())
			info, _ := e.Info()
			if strings.HasSuffix(e.Name(), ".key") && info.Mode().Perm() != 0o600 {
				t.Errorf("%s/%s: mode %v, want 0600", id, e.Name(), info.Mode().Perm())
			}
			b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
			if bytes.Equal(b, caKey) && id != "curator" {
				t.Errorf("%s holds the CA key", id)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, files) {
			t.Errorf("secrets/%s holds %v, want %v", id, got, files)
		}
	}
	err = filepath.WalkDir(filepath.Join(state, "public"), func(p string, d fs.DirEntry, err error) error {
		if b, _ := os.ReadFile(p); bytes.Contains(b, []byte("PRIVATE KEY")) {
			t.Errorf("public/ holds a key: %s", p)
		}
		return nil
	})
	if err != nil {
		t.Errorf("walk public/: %v", err)
	}

	// Every process is given files of public/, of its own identity and of
	// its own data, and no other (the curators: and the snapshots).
	for _, p := range c.processes() {
		for _, a := range p.args {
			rel, ok := strings.CutPrefix(a, state+string(filepath.Separator))
			if !ok {
				continue // not a path of the state directory
			}
			switch top := strings.Split(rel, string(filepath.Separator)); top[0] {
			case "public", "ticket":
			case "secrets":
				if p.identity == "" || top[1] != p.identity {
					t.Errorf("%s is given %s, of identity %s", p.name, rel, top[1])
				}
			case "data":
				if len(top) < 3 || p.name != top[1]+"-"+top[2] {
					t.Errorf("%s is given %s, another process's data", p.name, rel)
				}
			case snapshotsDir: // the curators share their snapshots
				if p.bin != "curator" {
					t.Errorf("%s is given %s, the curators' snapshots", p.name, rel)
				}
			default:
				t.Errorf("%s is given %s", p.name, rel)
			}
		}
	}

	// A second run (compose's pki service on every `up`) keeps the PKI.
	ids := []string{c.Nodes[0].ID, c.Nodes[1].ID}
	c = New(cfg)
	if err := c.PKI(); err != nil {
		t.Fatal(err)
	}
	if c.Nodes[0].ID != ids[0] || c.Nodes[1].ID != ids[1] {
		t.Errorf("ids changed: %s %s, were %v", c.Nodes[0].ID, c.Nodes[1].ID, ids)
	}

	// A state directory of the old layout, where every process read one
	// directory of keys.
	old := t.TempDir()
	if err := os.MkdirAll(filepath.Join(old, "pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.crt", "admin-admin.crt"} {
		if err := os.WriteFile(filepath.Join(old, "pki", f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg.State = old
	if err := New(cfg).PKI(); err == nil || !strings.Contains(err.Error(), "FRESH=1") {
		t.Fatalf("old layout: %v, want a refusal that says how to start over", err)
	}
}
