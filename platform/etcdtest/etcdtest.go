// Package etcdtest starts a real, single-member etcd in the test's process
// for the platform packages whose tests need one (fence, etcdpin). The
// services' tests run etcd in its own processes (consensustest).
package etcdtest

import (
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"curia.dev/platform/proctest"
)

// readyTimeout bounds how long Start waits for etcd to serve.
const readyTimeout = 20 * time.Second

// Start starts a single-member etcd cluster named name (a cluster of its
// own: the name is its cluster token, so two calls make two cluster ids)
// on 127.0.0.1 and returns its client URL. It is closed when the test
// ends; under -short the test is skipped.
func Start(t testing.TB, name string) string {
	t.Helper()
	proctest.SkipShort(t)
	var (
		e         *embed.Etcd
		clientURL url.URL
		err       error
	)
	// Another process may take a probed port before etcd binds it; try a
	// few times with fresh ports rather than fail on that race.
	for range 3 {
		cfg := embed.NewConfig()
		cfg.Name = name
		cfg.Dir = t.TempDir()
		peerURL := freeURL(t)
		clientURL = freeURL(t)
		cfg.ListenPeerUrls = []url.URL{peerURL}
		cfg.AdvertisePeerUrls = []url.URL{peerURL}
		cfg.ListenClientUrls = []url.URL{clientURL}
		cfg.AdvertiseClientUrls = []url.URL{clientURL}
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
		cfg.InitialClusterToken = name
		cfg.UnsafeNoFsync = true
		// A single member elects itself at once; short ticks only make
		// that first election quick (about 1s with the defaults).
		cfg.TickMs = 10
		cfg.ElectionMs = 100
		cfg.EnableGRPCGateway = false
		cfg.Logger = "zap"
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		e, err = embed.StartEtcd(cfg)
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		t.Fatalf("start etcd %s: %v", name, err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("etcd %s failed before it was ready: %v", name, err)
	case <-time.After(readyTimeout):
		t.Fatalf("etcd %s not ready after %v", name, readyTimeout)
	}
	return clientURL.String()
}

// freeURL returns an http URL on 127.0.0.1 with a port that was free a
// moment ago (the listener is closed right before etcd binds it).
func freeURL(t testing.TB) url.URL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatalf("close probe listener: %v", err)
	}
	return url.URL{Scheme: "http", Host: addr}
}
