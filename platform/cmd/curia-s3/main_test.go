package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/offsite"
	"curia.dev/platform/proctest"
	"curia.dev/platform/snapshots"
)

// TestServe: a snapshot copied to curia-s3 is fetched back after the
// server restarted on the same directory; bad flags are refused.
func TestServe(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: filepath.Join(dir, "s3"), Listen: proctest.FreeAddr(t), Buckets: []string{"backups"}}
	serve := func() (stop func()) {
		t.Helper()
		s, err := newServer(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := offsite.Options{Endpoint: cfg.Listen, Insecure: true}
	data := bytes.Repeat([]byte("etcd"), 1000)
	sum := sha256.Sum256(data)
	md := snapshots.Metadata{Name: snapshots.Name(time.Now(), 42), TakenAt: time.Now(), Revision: 42, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	local := snapshots.Dir(dir).DB(md.Name)
	if err := os.WriteFile(local, data, 0o600); err != nil {
		t.Fatal(err)
	}

	stop := serve()
	c, err := offsite.New("s3://backups/dev", opts)
	if err != nil {
		t.Fatal(err)
	}
	proctest.Eventually(t, 10*time.Second, func() error { // until it listens
		_, err := c.Upload(ctx, md, local)
		return err
	})
	stop()

	stop = serve()
	defer stop()
	dst := filepath.Join(dir, "fetched.db")
	proctest.Eventually(t, 10*time.Second, func() error {
		_, err := offsite.Fetch(ctx, "s3://backups/dev", opts, dst)
		return err
	})
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, data) {
		t.Fatalf("fetched %d bytes, want the %d uploaded", len(got), len(data))
	}

	for _, bad := range []Config{{Listen: "127.0.0.1:1"}, {Dir: dir, Listen: "nowhere"}} {
		if _, err := newServer(bad, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--") {
			t.Fatalf("%+v: %v, want the flag named", bad, err)
		}
	}
}
