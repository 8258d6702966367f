package pki

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestFileBase(t *testing.T) {
	for want, p := range map[string]Principal{
		"admin-alice":             allPrincipals["admin"],
		"curator":                 allPrincipals["curator"],
		"reconciler":              allPrincipals["reconciler"],
		testNodeID:                allPrincipals["node"],
		"consensus-" + testNodeID: allPrincipals["consensus"],
	} {
		if got := FileBase(p); got != want {
			t.Errorf("FileBase(%v) = %q, want %q", p, got, want)
		}
		if err := ValidateFileBase(want); err != nil {
			t.Errorf("ValidateFileBase(%q): %v", want, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "../x", "a/b", `a\b`, ".hidden", "/abs"} {
		if err := ValidateFileBase(bad); err == nil {
			t.Errorf("ValidateFileBase(%q) succeeded, want error", bad)
		}
	}
}

func TestWriteAndLoad(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, testCluster)
	iss := issue(t, ca, allPrincipals["admin"])

	paths, err := WriteCA(dir, ca)
	if err != nil {
		t.Fatalf("WriteCA: %v", err)
	}
	more, err := WritePair(dir, "admin-alice", iss.CertPEM, iss.KeyPEM)
	if err != nil {
		t.Fatalf("WritePair: %v", err)
	}
	p, err := WriteCluster(dir, testCluster)
	if err != nil {
		t.Fatalf("WriteCluster: %v", err)
	}
	paths = append(append(paths, more...), p)

	wantModes := map[string]fs.FileMode{
		CAKeyFile: 0o600, CACertFile: 0o644, CRLFile: 0o644, "admin-alice.key": 0o600, "admin-alice.crt": 0o644, ClusterFile: 0o644,
	}
	if len(paths) != len(wantModes) {
		t.Errorf("wrote %v, want %d files", paths, len(wantModes))
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(wantModes) {
		t.Errorf("directory holds %d entries, want %d (temporary files left?)", len(entries), len(wantModes))
	}
	for name, mode := range wantModes {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", name, st.Mode().Perm(), mode)
		}
	}

	loaded, err := LoadCAFromDir(dir)
	if err != nil {
		t.Fatalf("LoadCAFromDir: %v", err)
	}
	if !loaded.Cert.Equal(ca.Cert) || !publicKeysEqual(loaded.Key.Public(), ca.Key.Public()) {
		t.Error("loaded CA differs from the written one")
	}
	if got, err := ReadCluster(dir); err != nil || got != testCluster {
		t.Errorf("ReadCluster = %q, %v; want %q", got, err, testCluster)
	}
	if b, err := os.ReadFile(filepath.Join(dir, CRLFile)); err != nil {
		t.Error(err)
	} else if crl, err := VerifyCRL(b, ca.Cert); err != nil || len(crl.RevokedCertificateEntries) != 0 || crl.Number.Sign() != 0 {
		t.Errorf("%s: want an empty list of the CA numbered 0, got %v (%v)", CRLFile, crl, err)
	}
	crt, err := os.ReadFile(filepath.Join(dir, "admin-alice.crt"))
	if err != nil || !bytes.Equal(crt, iss.CertPEM) {
		t.Errorf("admin-alice.crt differs from the issued certificate (%v)", err)
	}

	// Overwriting keeps the mode of the new file, not of the old one.
	if err := os.Chmod(filepath.Join(dir, "admin-alice.key"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := WritePair(dir, "admin-alice", iss.CertPEM, iss.KeyPEM); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, "admin-alice.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("rewritten key: mode %v, %v; want 0600", st.Mode().Perm(), err)
	}

	found, err := Exists(dir, CACertFile, "missing.crt")
	if err != nil || len(found) != 1 || found[0] != filepath.Join(dir, CACertFile) {
		t.Errorf("Exists = %v, %v; want only ca.crt", found, err)
	}
}

func TestLoadCAFromDirErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadCAFromDir(dir); err == nil {
		t.Error("LoadCAFromDir of an empty directory succeeded")
	}
	if _, err := ReadCluster(dir); err == nil {
		t.Error("ReadCluster of an empty directory succeeded")
	}
	if err := os.WriteFile(filepath.Join(dir, ClusterFile), []byte("Bad Name\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCluster(dir); err == nil {
		t.Error("ReadCluster accepted an invalid cluster name")
	}
	ca, other := newTestCA(t, testCluster), newTestCA(t, testCluster)
	if _, err := WriteCA(dir, ca); err != nil {
		t.Fatal(err)
	}
	otherKey, err := other.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(filepath.Join(dir, CAKeyFile), otherKey, KeyFileMode); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCAFromDir(dir); err == nil {
		t.Error("LoadCAFromDir accepted a key that is not the CA's")
	}
}

func TestWriteFileAtomicMissingDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	if err := WriteFileAtomic(filepath.Join(dir, "x"), []byte("x"), 0o600); err == nil {
		t.Error("WriteFileAtomic into a missing directory succeeded")
	}
}
