package logging

import (
	"context"
	"log/slog"
	"slices"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Zap returns a zap logger that writes through log's handler, for libraries
// that log with zap (embedded etcd): their lines take the process's format
// and level, and log's fields. Levels below min are dropped as well, so a
// chatty library can be held quieter than the process (min
// slog.LevelDebug-1 drops nothing more).
func Zap(log *slog.Logger, min slog.Level) *zap.Logger {
	return zap.New(&slogCore{h: log.Handler(), min: min})
}

// ParseLevel reads a level name as --log-level takes it.
func ParseLevel(s string) (slog.Level, error) {
	opts, err := Config{Level: s}.handlerOptions()
	if err != nil {
		return 0, err
	}
	return opts.Level.Level(), nil
}

// slogCore is a zapcore.Core over a slog.Handler.
type slogCore struct {
	h   slog.Handler
	min slog.Level
}

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default: // error, dpanic, panic, fatal
		return slog.LevelError + slog.Level(l-zapcore.ErrorLevel)
	}
}

func (c *slogCore) Enabled(l zapcore.Level) bool {
	lvl := slogLevel(l)
	return lvl >= c.min && c.h.Enabled(context.Background(), lvl)
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{h: c.h.WithAttrs(attrs(fields)), min: c.min}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	r := slog.NewRecord(e.Time, slogLevel(e.Level), e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(attrs(fields)...)
	if e.Stack != "" {
		r.AddAttrs(slog.String("stack", e.Stack))
	}
	return c.h.Handle(context.Background(), r)
}

func (c *slogCore) Sync() error { return nil }

// attrs turns zap fields into slog attributes, in field order.
func attrs(fields []zapcore.Field) []slog.Attr {
	out := make([]slog.Attr, 0, len(fields))
	for _, f := range fields {
		enc := zapcore.NewMapObjectEncoder()
		f.AddTo(enc)
		keys := make([]string, 0, len(enc.Fields))
		for k := range enc.Fields {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, strings.Compare)
		for _, k := range keys {
			out = append(out, slog.Any(k, enc.Fields[k]))
		}
	}
	return out
}
