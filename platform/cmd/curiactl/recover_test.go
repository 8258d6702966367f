package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRecoverRefusesEarly: recover and snapshot restore refuse before
// asking anyone when the snapshot file fails its checks or no consensus
// address is set, each with what to do next.
func TestRecoverRefusesEarly(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.db")
	if err := os.WriteFile(bad, []byte("not a snapshot"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{envConsensus: "127.0.0.1:1"}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"snapshot", "restore", bad}, exitFailed, "no etcd snapshot stream"},
		{[]string{"recover", "--snapshot", filepath.Join(dir, "none.db")}, exitFailed, "no such file"},
		{[]string{"snapshot", "restore", "s3://bucket/x.db"}, exitFailed, "no object storage endpoint"},
		{[]string{"snapshot", "restore", "s3://bucket/x.db", "--s3-endpoint", "ftp://127.0.0.1:1"}, exitFailed, "ftp"},
		{[]string{"snapshot", "restore"}, exitUsage, "accepts 1 arg"},
		{[]string{"recover", "--consensus", ""}, exitConfig, "pass --ca or set CURIA_CACERT"},
		{[]string{"recover", "extra"}, exitUsage, "unknown command"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), tc.args, func(k string) string { return env[k] }, &out, &errOut)
		if code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, want %d and %q:\n%s%s", tc.args, code, tc.code, tc.want, out.String(), errOut.String())
		}
	}
	var errOut bytes.Buffer
	if code := run(context.Background(), []string{"recover"}, func(string) string { return "" }, &bytes.Buffer{}, &errOut); code != exitConfig || !strings.Contains(errOut.String(), "pass --consensus or set CURIA_CONSENSUS") {
		t.Errorf("recover without consensus addresses: exit %d\n%s", code, errOut.String())
	}
}
