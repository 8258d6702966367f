package kubernetes

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// fakeAPI is the Kubernetes API as far as the bootstrap Job uses it:
// Secrets and ConfigMaps in one namespace, create (409 when the name is
// taken), get and replace (404 when absent), behind a bearer token.
type fakeAPI struct {
	mu      sync.Mutex
	objects map[string][]byte // "<resource>/<name>" -> JSON
	creates int
	// failCreate, when > 0, fails the failCreate-th create with a 500,
	// as an API server that went away in the middle.
	failCreate int
}

func newFakeAPI(t *testing.T) (*fakeAPI, *API) {
	f := &fakeAPI{objects: map[string][]byte{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, &API{Server: srv.URL, Namespace: "curia", Token: func() (string, error) { return "token", nil }, Client: srv.Client()}
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer token" {
		http.Error(w, "no token", http.StatusUnauthorized)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/api/v1/namespaces/curia/")
	if !ok {
		http.Error(w, "not this namespace", http.StatusForbidden)
		return
	}
	res, name, _ := strings.Cut(rest, "/")
	body, _ := io.ReadAll(r.Body)
	switch r.Method {
	case http.MethodGet:
		b, ok := f.objects[res+"/"+name]
		if !ok {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		_, _ = w.Write(b)
	case http.MethodPost:
		f.creates++
		if f.creates == f.failCreate {
			http.Error(w, "gone", http.StatusInternalServerError)
			return
		}
		var meta struct {
			Metadata struct{ Name string } `json:"metadata"`
		}
		if err := json.Unmarshal(body, &meta); err != nil || meta.Metadata.Name == "" {
			http.Error(w, "no name", http.StatusBadRequest)
			return
		}
		if _, ok := f.objects[res+"/"+meta.Metadata.Name]; ok {
			http.Error(w, "exists", http.StatusConflict)
			return
		}
		f.objects[res+"/"+meta.Metadata.Name] = body
		_, _ = w.Write(body)
	case http.MethodPut:
		if _, ok := f.objects[res+"/"+name]; !ok {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		f.objects[res+"/"+name] = body
		_, _ = w.Write(body)
	default:
		http.Error(w, "method", http.StatusMethodNotAllowed)
	}
}

// snapshot is a copy of the stored objects.
func (f *fakeAPI) snapshot() map[string][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.objects)
}

func secretOf(t *testing.T, objs map[string][]byte, name string) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	if err := json.Unmarshal(objs["secrets/"+name], &s); err != nil {
		t.Fatalf("secret %s: %v", name, err)
	}
	return &s
}

// TestEnsurePKI: the first run makes every identity's Secret, then the
// public ConfigMap; a second run changes nothing and hands out the same
// admin; a run that died half-way is finished with one consistent CA.
func TestEnsurePKI(t *testing.T) {
	ctx := context.Background()
	f, api := newFakeAPI(t)
	admin, made, err := EnsurePKI(ctx, api, "curia")
	if err != nil || !made {
		t.Fatalf("EnsurePKI = %v, made %v", err, made)
	}
	first := f.snapshot()
	var want []string
	for obj := range first {
		want = append(want, obj)
	}
	slices.Sort(want)
	if got := []string{
		"configmaps/" + ConfigMapPublic, "secrets/" + SecretAdmin, "secrets/" + SecretCurator, "secrets/" + SecretReconciler,
		"secrets/" + SecretSeed, "secrets/" + SecretSeedConsensus,
	}; !slices.Equal(want, got) {
		t.Fatalf("objects %v, want %v", want, got)
	}
	checkPKI(t, first)
	if _, err := rpc.NewCredentials("curia", admin.CA, admin.Cert, admin.Key); err != nil {
		t.Fatalf("the admin's credentials: %v", err)
	}

	again, made, err := EnsurePKI(ctx, api, "curia")
	if err != nil || made {
		t.Fatalf("second EnsurePKI = %v, made %v: want the PKI kept", err, made)
	}
	if !maps.EqualFunc(first, f.snapshot(), func(a, b []byte) bool { return string(a) == string(b) }) {
		t.Fatal("the second run changed objects: it must never make another CA")
	}
	if string(again.Cert) != string(admin.Cert) || string(again.CA) != string(admin.CA) {
		t.Fatal("the second run hands out another admin")
	}

	// The API goes away at the third create: Secrets of a CA no pod
	// trusts yet (no ConfigMap). The next run makes one new PKI.
	f, api = newFakeAPI(t)
	f.failCreate = 3
	if _, _, err := EnsurePKI(ctx, api, "curia"); err == nil {
		t.Fatal("EnsurePKI succeeded while the API failed")
	}
	if _, ok := f.snapshot()["configmaps/"+ConfigMapPublic]; ok {
		t.Fatal("the public ConfigMap exists after a failed run")
	}
	if _, made, err := EnsurePKI(ctx, api, "curia"); err != nil || !made {
		t.Fatalf("EnsurePKI after a failed run = %v, made %v", err, made)
	}
	checkPKI(t, f.snapshot())
}

// checkPKI checks the objects an operator relies on: every certificate
// from the CA of curia-public, of the principal its Secret is for, with
// the names clients use; the CA key the curators hold is the CA's; the
// bootstrap node's certificates are for the id curia-public names, the
// member certificate for its consensus key.
func checkPKI(t *testing.T, objs map[string][]byte) {
	t.Helper()
	var public corev1.ConfigMap
	if err := json.Unmarshal(objs["configmaps/"+ConfigMapPublic], &public); err != nil {
		t.Fatal(err)
	}
	caPEM := []byte(public.Data[KeyCACert])
	roots, err := pki.CertPool(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.VerifyCRL([]byte(public.Data[KeyCRL]), mustCert(t, caPEM)); err != nil {
		t.Fatalf("crl.pem: %v", err)
	}
	seedID := strings.TrimSpace(public.Data[KeySeedID])
	cert := func(secret, key string, kind pki.Kind, name string, dns ...string) *x509.Certificate {
		t.Helper()
		c := mustCert(t, secretOf(t, objs, secret).Data[key])
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Fatalf("%s/%s: %v", secret, key, err)
		}
		p, err := pki.PrincipalFromCert(c, "curia")
		if err != nil || p.Kind != kind || p.Name != name {
			t.Fatalf("%s/%s is for %v (%v), want %s/%s", secret, key, p, err, kind, name)
		}
		for _, d := range dns {
			if !slices.Contains(c.DNSNames, d) {
				t.Fatalf("%s/%s names %v, not %s", secret, key, c.DNSNames, d)
			}
		}
		return c
	}
	cert(SecretAdmin, KeyTLSCert, pki.KindAdmin, "admin")
	cert(SecretCurator, KeyTLSCert, pki.KindCurator, "", "curia-curator", "curia-curator.curia.svc", "localhost")
	cert(SecretReconciler, KeyTLSCert, pki.KindReconciler, "", "curia-reconciler", "localhost")
	seedHost := SeedPod + "." + ServiceNodes
	boot := cert(SecretSeed, KeyBootCert, pki.KindNode, seedID, seedHost)
	cert(SecretSeedConsensus, KeyTLSCert, pki.KindConsensus, seedID, seedHost)
	member := cert(SecretSeedConsensus, KeyMemberCert, pki.KindMember, seedID, seedHost)

	if _, err := pki.LoadCA(caPEM, secretOf(t, objs, SecretCurator).Data[KeyCAKey]); err != nil {
		t.Fatalf("the curators' ca.key is not the CA's: %v", err)
	}
	nodeKey := mustKey(t, secretOf(t, objs, SecretSeed).Data[KeyNodeKey])
	if pki.NodeID(nodeKey.Public().(ed25519.PublicKey)) != seedID || !nodeKey.Public().(ed25519.PublicKey).Equal(boot.PublicKey) {
		t.Fatal("the seed's node key is not the one of its id and bootstrap certificate")
	}
	consKey := mustKey(t, secretOf(t, objs, SecretSeedConsensus).Data[KeyTLSKey])
	if !consKey.Public().(ed25519.PublicKey).Equal(member.PublicKey) {
		t.Fatal("the seed's member certificate is not for its consensus key")
	}
}

func mustCert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	c, err := pki.ParseCertPEM(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustKey(t *testing.T, b []byte) ed25519.PrivateKey {
	t.Helper()
	k, err := pki.ParsePrivateKeyPEM(b)
	if err != nil {
		t.Fatal(err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		t.Fatalf("a %T key, want ed25519", k)
	}
	return key
}

// TestAPIErrors: the API's refusals reach the caller as such.
func TestAPIErrors(t *testing.T) {
	ctx := context.Background()
	_, api := newFakeAPI(t)
	var s corev1.Secret
	if err := api.Get(ctx, "secrets", "none", &s); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a missing secret: %v, want ErrNotFound", err)
	}
	obj := ticketSecret([]byte("t1"))
	if err := api.Create(ctx, "secrets", obj); err != nil {
		t.Fatal(err)
	}
	if err := api.Create(ctx, "secrets", obj); !errors.Is(err, ErrExists) {
		t.Fatalf("second Create: %v, want ErrExists", err)
	}
	if err := api.Apply(ctx, "secrets", obj.Name, ticketSecret([]byte("t2"))); err != nil {
		t.Fatal(err)
	}
	if err := api.Get(ctx, "secrets", obj.Name, &s); err != nil || string(s.Data[KeyTicket]) != "t2" {
		t.Fatalf("after Apply: %q, %v", s.Data[KeyTicket], err)
	}
	api.Token = func() (string, error) { return "other", nil }
	if err := api.Get(ctx, "secrets", obj.Name, &s); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("Get with a wrong token: %v, want the API's 401", err)
	}
}

func node(id string, state curatorv1.NodeState, consensus bool) *curatorv1.Node {
	n := &curatorv1.Node{Id: id, State: state, Status: &curatorv1.NodeStatus{}}
	if consensus {
		n.Status.ConsensusPeerUrl = "https://" + id + ".curia-node:2380"
	}
	return n
}

// agreeing is a consensus status of n voters agreeing with their roles.
func agreeing(n int) *curatorv1.GetConsensusStatusResponse {
	st := &curatorv1.GetConsensusStatusResponse{Voters: uint32(n)} //nolint:gosec // G115: small
	for i := range n {
		st.Members = append(st.Members, &curatorv1.ConsensusMemberStatus{MemberId: uint64(i + 1), NodeExists: true, HasRole: true, Leader: i == 0})
	}
	return st
}

func TestPlan(t *testing.T) {
	cfg := DefaultBootstrapConfig() // 4 nodes, 3 voters
	up := func(ids ...string) []*curatorv1.Node {
		var out []*curatorv1.Node
		for _, id := range ids {
			out = append(out, node(id, curatorv1.NodeState_NODE_STATE_UP, true))
		}
		return out
	}
	for name, tc := range map[string]struct {
		st   bootstrapState
		v    view
		want step
	}{
		"the seed alone: wait": {
			v:    view{nodes: up("a"), consensus: agreeing(1)},
			want: step{waiting: "1 of 4 nodes UP with their consensus reported"},
		},
		"new nodes are approved, the lowest ids first, up to --nodes": {
			v: view{nodes: append(up("a", "b"), node("e", curatorv1.NodeState_NODE_STATE_NEW, false), node("c", curatorv1.NodeState_NODE_STATE_NEW, false),
				node("d", curatorv1.NodeState_NODE_STATE_NEW, false)), consensus: agreeing(1)},
			want: step{approve: []string{"c", "d"}, waiting: "2 of 4 nodes UP with their consensus reported"},
		},
		"a node that has not reported its consensus yet: wait": {
			v:    view{nodes: append(up("a", "b", "c"), node("d", curatorv1.NodeState_NODE_STATE_UP, false)), consensus: agreeing(1)},
			want: step{waiting: "3 of 4 nodes UP with their consensus reported"},
		},
		"every node up, no configuration: set the size": {
			v:    view{nodes: up("a", "b", "c", "d"), consensus: agreeing(1)},
			want: step{setSize: true, waiting: "control_plane_size being set"},
		},
		"the size set by this run: wait for 3 voters": {
			st:   bootstrapState{sizeSet: true},
			v:    view{nodes: up("a", "b", "c", "d"), configRevision: 1, consensus: agreeing(2)},
			want: step{waiting: "2 voters of 3"},
		},
		"a learner: wait": {
			st: bootstrapState{sizeSet: true},
			v: view{nodes: up("a", "b", "c", "d"), configRevision: 1, consensus: func() *curatorv1.GetConsensusStatusResponse {
				st := agreeing(3)
				st.Members[2].Learner = true
				return st
			}()},
			want: step{waiting: "member 3 still a learner"},
		},
		"3 voters: done": {
			st:   bootstrapState{sizeSet: true},
			v:    view{nodes: up("a", "b", "c", "d"), configRevision: 1, consensus: agreeing(3)},
			want: step{done: true},
		},
		"run again on an operator's configuration: done once roles and membership agree": {
			v:    view{nodes: up("a", "b", "c", "d", "e"), configRevision: 7, consensus: agreeing(5)},
			want: step{done: true},
		},
		"run again, a node deleted since and a new one registered: it is not approved": {
			v:    view{nodes: append(up("a", "b", "c"), node("e", curatorv1.NodeState_NODE_STATE_NEW, false)), configRevision: 7, consensus: agreeing(3)},
			want: step{done: true},
		},
		"run again with a node down (a roll, a failure): done once roles and membership agree": {
			v:    view{nodes: append(up("a", "b", "c"), node("d", curatorv1.NodeState_NODE_STATE_UP, false)), configRevision: 7, consensus: agreeing(3)},
			want: step{done: true},
		},
		"run again while a member is a learner: wait": {
			v: view{nodes: up("a", "b", "c", "d"), configRevision: 7, consensus: func() *curatorv1.GetConsensusStatusResponse {
				st := agreeing(3)
				st.Members[1].Learner = true
				return st
			}()},
			want: step{waiting: "member 2 still a learner"},
		},
		"run again, a node added since: it is not approved": {
			v:    view{nodes: append(up("a", "b", "c", "d"), node("e", curatorv1.NodeState_NODE_STATE_NEW, false)), configRevision: 7, consensus: agreeing(3)},
			want: step{done: true},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := plan(cfg, tc.st, tc.v)
			if !slices.Equal(got.approve, tc.want.approve) || got.setSize != tc.want.setSize || got.done != tc.want.done || got.waiting != tc.want.waiting {
				t.Fatalf("plan = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestNodeKey: the first start makes the key and writes the id; a restart
// keeps both; a damaged key is refused, never replaced.
func TestNodeKey(t *testing.T) {
	dir := t.TempDir()
	cfg := NodeKeyConfig{Key: filepath.Join(dir, "data", "node.key"), IDFile: filepath.Join(dir, "id", "node.id")}
	for _, d := range []string{"data", "id"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	id, err := NodeKey(cfg)
	if err != nil {
		t.Fatal(err)
	}
	key := mustKey(t, must(os.ReadFile(cfg.Key)))
	if pki.NodeID(key.Public().(ed25519.PublicKey)) != id || strings.TrimSpace(string(must(os.ReadFile(cfg.IDFile)))) != id {
		t.Fatal("the id is not the key's, or not in the id file")
	}
	if st, err := os.Stat(cfg.Key); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("node key mode %v (%v), want 0600", st.Mode().Perm(), err)
	}
	// A restart: the id file is gone (an emptyDir), the key is kept.
	if err := os.Remove(cfg.IDFile); err != nil {
		t.Fatal(err)
	}
	if again, err := NodeKey(cfg); err != nil || again != id {
		t.Fatalf("restart: id %s (%v), want %s", again, err, id)
	}
	if err := os.WriteFile(cfg.Key, []byte("damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NodeKey(cfg); err == nil {
		t.Fatal("a damaged key was accepted")
	}
	if string(must(os.ReadFile(cfg.Key))) != "damaged" {
		t.Fatal("a damaged key was replaced: the node would come back as another node")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
