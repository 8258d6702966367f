package main

import (
	"bytes"
	"net"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/health"
	"google.golang.org/grpc/health/grpc_health_v1"

	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpc/rpctest"
)

const cluster = "probe.test"

// writePair issues a certificate for p into dir and returns its files.
func writePair(t *testing.T, ca *pki.CA, dir string, p pki.Principal) rpc.TLSFiles {
	t.Helper()
	iss, err := ca.Issue(pki.IssueRequest{Cluster: cluster, Principal: p, Validity: time.Hour, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	base := pki.FileBase(p)
	if _, err := pki.WritePair(dir, base, iss.CertPEM, iss.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return rpc.TLSFiles{CA: filepath.Join(dir, pki.CACertFile), Cert: filepath.Join(dir, pki.CertFile(base)), Key: filepath.Join(dir, pki.KeyFile(base))}
}

func TestProbe(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA(cluster, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.WriteCA(dir, ca); err != nil {
		t.Fatal(err)
	}
	server := writePair(t, ca, dir, pki.Principal{Kind: pki.KindCurator})
	client := writePair(t, ca, dir, pki.Principal{Kind: pki.KindReconciler})

	creds, err := rpc.LoadCredentials(cluster, server)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rpc.NewServer(rpc.ServerConfig{Credentials: creds, Policy: rpc.Policy{}})
	if err != nil {
		t.Fatal(err)
	}
	addr := rpctest.Serve(t, srv)

	probe := func(extra ...string) (int, string) {
		args := append([]string{"--addr", addr, "--cluster", cluster, "--ca", client.CA, "--cert", client.Cert, "--key", client.Key, "--timeout", "2s"}, extra...)
		var out bytes.Buffer
		code := run(args, &out, &out)
		return code, out.String()
	}

	// A server starts NOT_SERVING until the service says it is ready; it
	// is alive all the same.
	if code, out := probe(); code != 1 || !strings.Contains(out, "NOT_SERVING") {
		t.Errorf("before ready: exit %d, %q; want 1 and NOT_SERVING", code, out)
	}
	if code, out := probe("--live"); code != 0 || !strings.Contains(out, "NOT_SERVING") {
		t.Errorf("--live before ready: exit %d, %q; want 0 and NOT_SERVING", code, out)
	}
	srv.Health().SetServingStatus("", grpc_health_v1.HealthCheckResponse_SERVING)
	if code, out := probe(); code != 0 || !strings.Contains(out, "SERVING") {
		t.Errorf("ready: exit %d, %q; want 0 and SERVING", code, out)
	}
	if code, out := probe("--quiet"); code != 0 || out != "" {
		t.Errorf("quiet: exit %d, %q; want 0 and no output", code, out)
	}
	if code, _ := probe("--service", "no.such.Service"); code != 1 {
		t.Errorf("unknown service: exit %d, want 1", code)
	}

	// Nothing listening: unhealthy, not a misconfiguration.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := closed.Addr().String()
	closed.Close()
	var out bytes.Buffer
	if code := run([]string{"--addr", gone, "--cluster", cluster, "--ca", client.CA, "--cert", client.Cert, "--key", client.Key}, &out, &out); code != 1 {
		t.Errorf("nothing listening: exit %d (%s), want 1", code, out.String())
	}
	out.Reset()
	if code := run([]string{"--live", "--timeout", "1s", "--addr", gone, "--cluster", cluster, "--ca", client.CA, "--cert", client.Cert, "--key", client.Key}, &out, &out); code != 1 {
		t.Errorf("--live, nothing listening: exit %d (%s), want 1", code, out.String())
	}

	// Misconfigured probes exit 2.
	for name, args := range map[string][]string{
		"no addr":       {"--ca", client.CA, "--cert", client.Cert, "--key", client.Key},
		"missing key":   {"--addr", addr, "--cluster", cluster, "--ca", client.CA, "--cert", client.Cert},
		"wrong cluster": {"--addr", addr, "--cluster", "other", "--ca", client.CA, "--cert", client.Cert, "--key", client.Key},
		"bad flag":      {"--nope"},
	} {
		out.Reset()
		if code := run(args, &out, &out); code != 2 {
			t.Errorf("%s: exit %d (%s), want 2", name, code, out.String())
		}
	}
}

// TestProbeHTTP: --http asks /healthz (rpc.Healthz): 200 is SERVING, 503
// is not, but with --live any answer is alive; no answer never is.
func TestProbeHTTP(t *testing.T) {
	h := health.NewServer()
	h.SetServingStatus("", grpc_health_v1.HealthCheckResponse_NOT_SERVING)
	srv := httptest.NewServer(rpc.Healthz(h))
	defer srv.Close()
	url := srv.URL + "/healthz"
	probe := func(args ...string) (int, string) {
		var out bytes.Buffer
		code := run(args, &out, &out)
		return code, out.String()
	}
	if code, out := probe("--http", url); code != 1 || !strings.Contains(out, "503") {
		t.Errorf("NOT_SERVING: exit %d, %q; want 1 and 503", code, out)
	}
	if code, out := probe("--live", "--http", url); code != 0 || !strings.Contains(out, "503") {
		t.Errorf("--live, NOT_SERVING: exit %d, %q; want 0 and 503", code, out)
	}
	h.SetServingStatus("", grpc_health_v1.HealthCheckResponse_SERVING)
	if code, out := probe("--quiet", "--http", url); code != 0 || out != "" {
		t.Errorf("SERVING: exit %d, %q; want 0 and no output", code, out)
	}
	srv.Close()
	if code, out := probe("--live", "--timeout", "1s", "--http", url); code != 1 {
		t.Errorf("--live, nothing listening: exit %d, %q; want 1", code, out)
	}
}
