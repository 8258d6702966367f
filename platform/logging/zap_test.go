package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestZapFollowsTheProcessLogger: a library's zap lines come out in the
// process's format, at its level (and not below min), with its fields.
func TestZapFollowsTheProcessLogger(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, Config{Level: "info", Format: "json"})
	if err != nil {
		t.Fatal(err)
	}
	z := Zap(log.With("part", "etcd"), slog.LevelDebug).With(zap.String("member", "8e9e05c52164694d"))
	z.Debug("dropped: below the process level")
	z.Info("ready to serve client requests", zap.Int("port", 2379), zap.Strings("urls", []string{"https://a", "https://b"}))
	z.Warn("slow fdatasync", zap.Duration("took", 1500000000))

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2 (debug dropped):\n%s", len(lines), buf.String())
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatalf("not the process's JSON format: %v\n%s", err, lines[0])
	}
	for k, want := range map[string]any{"level": "INFO", "msg": "ready to serve client requests", "part": "etcd", "member": "8e9e05c52164694d", "port": float64(2379)} {
		if first[k] != want {
			t.Errorf("%s = %v, want %v (line %s)", k, first[k], want, lines[0])
		}
	}
	if !strings.Contains(lines[1], `"level":"WARN"`) {
		t.Errorf("warn line: %s", lines[1])
	}

	buf.Reset()
	Zap(log, slog.LevelWarn).Info("held quieter than the process")
	if buf.Len() != 0 {
		t.Fatalf("info below min was written: %s", buf.String())
	}
}
