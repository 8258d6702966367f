package kubernetes

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"curia.dev/platform/pki"
)

// The names of the Services and of the bootstrap node's pod, which the
// certificates the Job issues carry (the manifests test checks them
// against base/).
const (
	ServiceNodes      = "curia-node"
	ServiceCurator    = "curia-curator"
	ServiceReconciler = "curia-reconciler"
	// SeedPod is the bootstrap node's pod: curia-seed's only replica.
	SeedPod = "curia-seed-0"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	certValidity = 365 * 24 * time.Hour
)

// PKI is what the bootstrap Job writes: a Secret per identity, and the
// public ConfigMap, written last, whose presence means the PKI is complete.
type PKI struct {
	Secrets []*corev1.Secret
	Public  *corev1.ConfigMap
}

// Secret returns the Secret of that name, or nil.
func (p *PKI) Secret(name string) *corev1.Secret {
	for _, s := range p.Secrets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// hosts are the DNS names of a Service, or of a pod under a headless
// Service, in namespace ns: the short ones pods use, the qualified ones
// too, and loopback (kubectl port-forward, the probes).
func hosts(name, ns string) []string {
	return []string{name, name + "." + ns, name + "." + ns + ".svc", "localhost"}
}

// NewPKI makes a new cluster CA and every identity the deployment issues:
// the admin, the curators (with the CA key: they certify nodes), the
// reconcilers, and the bootstrap node (its agent's key and certificate,
// its consensus process's key with consensus and member certificates).
// Every other node's identity is made in its pod.
func NewPKI(cluster, ns string) (*PKI, error) {
	ca, err := pki.NewCA(cluster, caValidity)
	if err != nil {
		return nil, err
	}
	crl, err := ca.InitialCRL()
	if err != nil {
		return nil, err
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	issue := func(p pki.Principal, pub ed25519.PublicKey, dns []string) (*pki.Issued, error) {
		req := pki.IssueRequest{Cluster: cluster, Principal: p, Validity: certValidity}
		if pub != nil {
			req.PublicKey = pub // else a new key, in Issued.KeyPEM
		}
		if p.Kind != pki.KindAdmin {
			req.DNSNames, req.IPs = dns, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		}
		return ca.Issue(req)
	}
	out := &PKI{}
	add := func(name string, data map[string][]byte) {
		out.Secrets = append(out.Secrets, &corev1.Secret{
			TypeMeta:   typeMeta("Secret"),
			ObjectMeta: objectMeta(name),
			Type:       corev1.SecretTypeOpaque,
			Data:       data,
		})
	}
	for _, id := range []struct {
		secret string
		p      pki.Principal
		dns    []string
	}{
		{SecretAdmin, pki.Principal{Kind: pki.KindAdmin, Name: "admin"}, nil},
		{SecretCurator, pki.Principal{Kind: pki.KindCurator}, hosts(ServiceCurator, ns)},
		{SecretReconciler, pki.Principal{Kind: pki.KindReconciler}, hosts(ServiceReconciler, ns)},
	} {
		iss, err := issue(id.p, nil, id.dns)
		if err != nil {
			return nil, err
		}
		data := map[string][]byte{KeyTLSCert: iss.CertPEM, KeyTLSKey: iss.KeyPEM}
		if id.secret == SecretCurator {
			data[KeyCAKey] = caKey
		}
		add(id.secret, data)
	}

	// The bootstrap node: its agent's key and node certificate, and its
	// consensus process's own key with the consensus and member
	// certificates, for its stable name under the headless Service.
	seedHosts := hosts(SeedPod+"."+ServiceNodes, ns)
	nodeKey, err := pki.NewNodeKey()
	if err != nil {
		return nil, err
	}
	nodePub := nodeKey.Public().(ed25519.PublicKey)
	id := pki.NodeID(nodePub)
	boot, err := issue(pki.Principal{Kind: pki.KindNode, Name: id}, nodePub, seedHosts)
	if err != nil {
		return nil, err
	}
	nodeKeyPEM, err := pki.MarshalEd25519PEM(nodeKey)
	if err != nil {
		return nil, err
	}
	add(SecretSeed, map[string][]byte{KeyNodeKey: nodeKeyPEM, KeyBootCert: boot.CertPEM})
	consKey, err := pki.NewNodeKey()
	if err != nil {
		return nil, err
	}
	consPub := consKey.Public().(ed25519.PublicKey)
	consCert, err := issue(pki.Principal{Kind: pki.KindConsensus, Name: id}, consPub, seedHosts)
	if err != nil {
		return nil, err
	}
	memberCert, err := issue(pki.Principal{Kind: pki.KindMember, Name: id}, consPub, seedHosts)
	if err != nil {
		return nil, err
	}
	consKeyPEM, err := pki.MarshalEd25519PEM(consKey)
	if err != nil {
		return nil, err
	}
	add(SecretSeedConsensus, map[string][]byte{KeyTLSKey: consKeyPEM, KeyTLSCert: consCert.CertPEM, KeyMemberCert: memberCert.CertPEM})

	out.Public = &corev1.ConfigMap{
		TypeMeta:   typeMeta("ConfigMap"),
		ObjectMeta: objectMeta(ConfigMapPublic),
		Data:       map[string]string{KeyCACert: string(ca.CertPEM), KeyCRL: string(crl), KeySeedID: id + "\n"},
	}
	return out, nil
}

func typeMeta(kind string) metav1.TypeMeta { return metav1.TypeMeta{APIVersion: "v1", Kind: kind} }

func objectMeta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"app.kubernetes.io/part-of":    "curia",
		"app.kubernetes.io/managed-by": "curia-bootstrap",
	}}
}

// EnsurePKI makes the PKI unless it is complete (the public ConfigMap
// exists): it never replaces a CA that pods may trust. A PKI an earlier
// attempt left half-made is replaced: no pod started on it, since every pod
// mounts the public ConfigMap, written last. It returns the admin's
// credentials, and whether it made the PKI.
func EnsurePKI(ctx context.Context, api *API, cluster string) (*Admin, bool, error) {
	var public corev1.ConfigMap
	err := api.Get(ctx, "configmaps", ConfigMapPublic, &public)
	if err == nil {
		var admin corev1.Secret
		if err := api.Get(ctx, "secrets", SecretAdmin, &admin); err != nil {
			return nil, false, fmt.Errorf("the PKI exists (configmap %s), but not the admin's secret: %w", ConfigMapPublic, err)
		}
		return &Admin{CA: []byte(public.Data[KeyCACert]), Cert: admin.Data[KeyTLSCert], Key: admin.Data[KeyTLSKey]}, false, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, false, err
	}
	p, err := NewPKI(cluster, api.Namespace)
	if err != nil {
		return nil, false, fmt.Errorf("make the PKI: %w", err)
	}
	for _, s := range p.Secrets {
		if err := api.Apply(ctx, "secrets", s.Name, s); err != nil {
			return nil, false, fmt.Errorf("secret %s: %w", s.Name, err)
		}
	}
	if err := api.Create(ctx, "configmaps", p.Public); err != nil {
		return nil, false, fmt.Errorf("configmap %s: %w", ConfigMapPublic, err)
	}
	admin := p.Secret(SecretAdmin)
	return &Admin{CA: []byte(p.Public.Data[KeyCACert]), Cert: admin.Data[KeyTLSCert], Key: admin.Data[KeyTLSKey]}, true, nil
}
