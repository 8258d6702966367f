package kubernetes

import (
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"

	"curia.dev/platform/pki"
)

// NodeKeyConfig is curia-kube node-key's: the init container of every
// curia-node pod, which gives the node its identity on its first start
// and tells its consensus process the node id on every start.
type NodeKeyConfig struct {
	// Key is the node's ed25519 key on the pod's own volume: made when
	// absent, never replaced (a node's id follows from it).
	Key string
	// IDFile receives the node id, for consensus --node-id-file.
	IDFile string
}

// AddFlags registers the flags.
func (c *NodeKeyConfig) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Key, "key", c.Key, "the node's ed25519 key (PKCS#8 PEM), made when absent; the node agent's --node-key")
	fs.StringVar(&c.IDFile, "id-file", c.IDFile, "file to write the node id to (consensus --node-id-file)")
}

// NodeKey makes the node's key unless it exists, writes the node id and
// returns it.
func NodeKey(cfg NodeKeyConfig) (string, error) {
	if cfg.Key == "" || cfg.IDFile == "" {
		return "", errors.New("--key and --id-file are required")
	}
	var key ed25519.PrivateKey
	b, err := os.ReadFile(cfg.Key)
	switch {
	case err == nil:
		k, err := pki.ParsePrivateKeyPEM(b)
		if err != nil {
			return "", fmt.Errorf("node key %s: %w (a node's key is never replaced: delete the pod's volume to make a new node)", cfg.Key, err)
		}
		var ok bool
		if key, ok = k.(ed25519.PrivateKey); !ok {
			return "", fmt.Errorf("node key %s: a %T, not ed25519", cfg.Key, k)
		}
	case errors.Is(err, fs.ErrNotExist):
		if key, err = pki.NewNodeKey(); err != nil {
			return "", err
		}
		pem, err := pki.MarshalEd25519PEM(key)
		if err != nil {
			return "", err
		}
		if err := pki.WriteFileAtomic(cfg.Key, pem, pki.KeyFileMode); err != nil {
			return "", fmt.Errorf("write node key: %w", err)
		}
	default:
		return "", fmt.Errorf("read node key: %w", err)
	}
	id := pki.NodeID(key.Public().(ed25519.PublicKey))
	if err := pki.WriteFileAtomic(cfg.IDFile, []byte(id+"\n"), pki.CertFileMode); err != nil {
		return "", fmt.Errorf("write node id: %w", err)
	}
	return id, nil
}
