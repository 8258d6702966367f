package pki

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// File names in a PKI directory (see the package comment).
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
	// CRLFile is the CA's initial revocation list (empty, number 0), for the
	// first etcd member, which starts before any curator can revoke.
	CRLFile     = "crl.pem"
	ClusterFile = "cluster"
)

// Permissions: private keys are for the owner only.
const (
	KeyFileMode  fs.FileMode = 0o600
	CertFileMode fs.FileMode = 0o644
)

// FileBase is the default base name of a principal's certificate and key
// files: "admin-<name>", "curator", "reconciler", "consensus-<node-id>", and
// for a node its id alone ("node-<hex>"), which already says what it is.
func FileBase(p Principal) string {
	switch {
	case p.Kind == KindNode:
		return p.Name
	case p.Name == "":
		return string(p.Kind)
	default:
		return string(p.Kind) + "-" + p.Name
	}
}

// CertFile names the certificate file of a base name.
func CertFile(base string) string { return base + ".crt" }

// KeyFile names the private key file of a base name.
func KeyFile(base string) string { return base + ".key" }

// NodeKeyFile names the file of a node's ed25519 identity key.
func NodeKeyFile(nodeID string) string { return nodeID + ".ed25519.key" }

// ValidateFileBase checks a base name given by a user: it must stay inside
// the PKI directory and not be hidden.
func ValidateFileBase(base string) error {
	if base == "" || base != filepath.Base(base) || strings.HasPrefix(base, ".") || strings.ContainsAny(base, `/\`) {
		return fmt.Errorf("file name %q: want a plain file name without directories", base)
	}
	return nil
}

// WriteFileAtomic writes data to path through a temporary file in the same
// directory and a rename, so a reader (or a crash) never sees a half-written
// file. The file is synced before the rename and the directory after it.
func WriteFileAtomic(path string, data []byte, perm fs.FileMode) (err error) {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	// CreateTemp makes 0600 files; widen (or keep) before any byte lands so a
	// key is never readable by others, not even for a moment.
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// WritePair writes <base>.key (0600, skipped when keyPEM is nil) and then
// <base>.crt (0644) into dir, each atomically. The key goes first so that a
// certificate on disk always has its key next to it. It returns the paths
// written.
func WritePair(dir, base string, certPEM, keyPEM []byte) ([]string, error) {
	if err := ValidateFileBase(base); err != nil {
		return nil, err
	}
	var written []string
	if keyPEM != nil {
		p := filepath.Join(dir, KeyFile(base))
		if err := WriteFileAtomic(p, keyPEM, KeyFileMode); err != nil {
			return written, err
		}
		written = append(written, p)
	}
	p := filepath.Join(dir, CertFile(base))
	if err := WriteFileAtomic(p, certPEM, CertFileMode); err != nil {
		return written, err
	}
	return append(written, p), nil
}

// WriteCA writes ca.key, crl.pem (an empty revocation list, number 0) and
// ca.crt into dir, ca.crt last, and returns the paths written.
func WriteCA(dir string, ca *CA) ([]string, error) {
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	crlPEM, err := ca.InitialCRL()
	if err != nil {
		return nil, err
	}
	var written []string
	for _, f := range []struct {
		name string
		data []byte
		perm fs.FileMode
	}{
		{CAKeyFile, keyPEM, KeyFileMode},
		{CRLFile, crlPEM, CertFileMode},
		{CACertFile, ca.CertPEM, CertFileMode},
	} {
		p := filepath.Join(dir, f.name)
		if err := WriteFileAtomic(p, f.data, f.perm); err != nil {
			return written, err
		}
		written = append(written, p)
	}
	return written, nil
}

// LoadCAFromDir loads the CA from dir/ca.crt and dir/ca.key.
func LoadCAFromDir(dir string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	ca, err := LoadCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load CA from %s: %w", dir, err)
	}
	return ca, nil
}

// WriteCluster writes the cluster name to dir/cluster and returns the path.
func WriteCluster(dir, cluster string) (string, error) {
	if err := ValidateCluster(cluster); err != nil {
		return "", err
	}
	p := filepath.Join(dir, ClusterFile)
	return p, WriteFileAtomic(p, []byte(cluster+"\n"), CertFileMode)
}

// ReadCluster reads and validates the cluster name from dir/cluster.
func ReadCluster(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, ClusterFile))
	if err != nil {
		return "", fmt.Errorf("read cluster name: %w", err)
	}
	cluster := strings.TrimSpace(string(b))
	if err := ValidateCluster(cluster); err != nil {
		return "", fmt.Errorf("%s: %w", filepath.Join(dir, ClusterFile), err)
	}
	return cluster, nil
}

// Exists reports which of the named files exist in dir. Any error other than
// "does not exist" (say, permission denied) is returned: an unreadable
// directory must not look empty to a tool deciding whether to overwrite.
func Exists(dir string, names ...string) ([]string, error) {
	var found []string
	for _, n := range names {
		p := filepath.Join(dir, n)
		_, err := os.Lstat(p)
		switch {
		case err == nil:
			found = append(found, p)
		case !errors.Is(err, fs.ErrNotExist):
			return nil, err
		}
	}
	return found, nil
}
