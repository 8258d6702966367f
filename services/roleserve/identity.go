package roleserve

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// dataFiles is the layout of the data directory (0700):
//
//	identity.key    the node's ed25519 key, PKCS#8 (0600); the node id
//	                follows from it and never changes
//	enrolment.json  the enrolment state machine (state.go), with the
//	                record of the member this node bootstrapped
//	node.crt        the node/<id> certificate: the bootstrap certificate,
//	node.key        or the one CommitNode issued for identity.key (0600)
//	node.pb         the last record of this node seen from the curator
//	                (its roles); its presence means the curator has
//	                confirmed the node's roles at least once
type dataFiles struct {
	dir         string
	identityKey string
	enrolment   string
	nodeCert    string
	nodeKey     string
	nodeRecord  string
}

// nodeCertBase is the base name of node.crt and node.key (pki.WritePair).
const nodeCertBase = "node"

func prepareDataDir(dir string) (dataFiles, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return dataFiles{}, fmt.Errorf("create data dir: %w", err)
	}
	// The directory holds private keys: owner only, also when it existed.
	if err := os.Chmod(dir, 0o700); err != nil { //nolint:gosec // G302: a directory, owner only
		return dataFiles{}, fmt.Errorf("restrict data dir: %w", err)
	}
	return dataFiles{
		dir:         dir,
		identityKey: filepath.Join(dir, "identity.key"),
		enrolment:   filepath.Join(dir, "enrolment.json"),
		nodeCert:    filepath.Join(dir, pki.CertFile(nodeCertBase)),
		nodeKey:     filepath.Join(dir, pki.KeyFile(nodeCertBase)),
		nodeRecord:  filepath.Join(dir, "node.pb"),
	}, nil
}

// loadOrCreateKey returns the node's ed25519 key from path. On first start
// (no file) it takes the key of nodeKeyFile, or generates one, and stores it
// (0600). A nodeKeyFile naming another key than the stored one is an error:
// a node's identity never changes.
func loadOrCreateKey(path, nodeKeyFile string) (ed25519.PrivateKey, error) {
	var given ed25519.PrivateKey
	if nodeKeyFile != "" {
		b, err := os.ReadFile(nodeKeyFile)
		if err != nil {
			return nil, fmt.Errorf("read --node-key: %w", err)
		}
		if given, err = pki.ParseEd25519PEM(b); err != nil {
			return nil, fmt.Errorf("--node-key %s: %w", nodeKeyFile, err)
		}
	}
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		key, err := pki.ParseEd25519PEM(b)
		if err != nil {
			return nil, fmt.Errorf("node key %s: %w", path, err)
		}
		if given != nil && !given.Equal(key) {
			return nil, fmt.Errorf("the data dir holds the key of %s but --node-key is the key of %s: a node's identity never changes (use another data dir for another node)",
				pki.NodeID(key.Public().(ed25519.PublicKey)), pki.NodeID(given.Public().(ed25519.PublicKey)))
		}
		if err := os.Chmod(path, pki.KeyFileMode); err != nil {
			return nil, fmt.Errorf("restrict node key: %w", err)
		}
		return key, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("read node key: %w", err)
	}
	key := given
	if key == nil {
		if key, err = pki.NewNodeKey(); err != nil {
			return nil, err
		}
	}
	pemKey, err := pki.MarshalEd25519PEM(key)
	if err != nil {
		return nil, err
	}
	if err := pki.WriteFileAtomic(path, pemKey, pki.KeyFileMode); err != nil {
		return nil, fmt.Errorf("store node key: %w", err)
	}
	return key, nil
}

// nodeCreds is a node certificate with its key.
type nodeCreds struct {
	creds           *rpc.Credentials
	certPEM, keyPEM []byte
}

// checkNodeCreds parses a node certificate and key and checks them: they
// chain to the cluster CA and name node/<id>.
func checkNodeCreds(cluster string, caPEM, certPEM, keyPEM []byte, id string) (*nodeCreds, error) {
	creds, err := rpc.NewCredentials(cluster, caPEM, certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	if want := (pki.Principal{Kind: pki.KindNode, Name: id}); creds.Principal != want {
		return nil, fmt.Errorf("certificate is for %s, not for this node (%s)", creds.Principal, want)
	}
	return &nodeCreds{creds: creds, certPEM: certPEM, keyPEM: keyPEM}, nil
}

// loadNodeCreds reads and checks a node certificate and key from files.
func loadNodeCreds(cluster string, caPEM []byte, certPath, keyPath, id string) (*nodeCreds, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("read node certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("read node certificate key: %w", err)
	}
	return checkNodeCreds(cluster, caPEM, certPEM, keyPEM, id)
}

// storeNodeCreds writes node.key (0600) and node.crt, each atomically.
func (f dataFiles) storeNodeCreds(c *nodeCreds) error {
	if _, err := pki.WritePair(f.dir, nodeCertBase, c.certPEM, c.keyPEM); err != nil {
		return fmt.Errorf("store node certificate: %w", err)
	}
	return nil
}

// loadNodeRecord reads the persisted node record; nil when there is none.
func loadNodeRecord(path string) (*curatorv1.Node, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read persisted roles: %w", err)
	}
	n := &curatorv1.Node{}
	if err := proto.Unmarshal(b, n); err != nil {
		return nil, fmt.Errorf("read persisted roles %s: %w", path, err)
	}
	return n, nil
}

// storeNodeRecord persists the node record (atomic write), without the
// fields the curator computes when sending.
func storeNodeRecord(path string, n *curatorv1.Node) error {
	n = proto.Clone(n).(*curatorv1.Node)
	n.Health, n.LastHeartbeat = curatorv1.NodeHealth_NODE_HEALTH_UNSPECIFIED, nil
	b, err := proto.Marshal(n)
	if err != nil {
		return fmt.Errorf("encode node record: %w", err)
	}
	if err := pki.WriteFileAtomic(path, b, 0o600); err != nil {
		return fmt.Errorf("persist roles: %w", err)
	}
	return nil
}
