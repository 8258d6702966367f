// Package logging builds the one structured logger of a curia process.
//
// Every process creates a single *slog.Logger from flags and hands each
// component a named sub-logger:
//
//	logger, err := logging.New(os.Stderr, cfg.Log)
//	curator := logger.With("component", "curator")
//
// Messages are static; facts go into fields (node, member, fence, term).
package logging

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// Config selects the level and format of the process logger.
type Config struct {
	// Level is a slog level name: "debug", "info", "warn" or "error"
	// (offsets such as "info+2" are accepted too).
	Level string
	// Format is "text" (logfmt-like, for people) or "json" (for collectors).
	Format string
}

// Defaults used for empty Config fields.
const (
	DefaultLevel  = "info"
	DefaultFormat = "text"
)

// DefaultConfig returns the configuration used when no flag is given.
func DefaultConfig() Config {
	return Config{Level: DefaultLevel, Format: DefaultFormat}
}

// AddFlags registers -log-level and -log-format, defaulting to the current
// values of c (or the package defaults where those are empty).
func (c *Config) AddFlags(fs *flag.FlagSet) {
	def := c.withDefaults()
	fs.StringVar(&c.Level, "log-level", def.Level, "log level: debug, info, warn or error")
	fs.StringVar(&c.Format, "log-format", def.Format, "log format: text or json")
}

// Validate reports a level or format that New would reject.
func (c Config) Validate() error {
	_, err := c.handlerOptions()
	if err != nil {
		return err
	}
	switch f := c.withDefaults().Format; f {
	case "text", "json":
		return nil
	default:
		return fmt.Errorf("log format %q: want text or json", f)
	}
}

// New returns a logger writing to w.
func New(w io.Writer, cfg Config) (*slog.Logger, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts, _ := cfg.handlerOptions()
	if cfg.withDefaults().Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

func (c Config) withDefaults() Config {
	if c.Level == "" {
		c.Level = DefaultLevel
	}
	if c.Format == "" {
		c.Format = DefaultFormat
	}
	return c
}

func (c Config) handlerOptions() (*slog.HandlerOptions, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.withDefaults().Level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", c.Level)
	}
	return &slog.HandlerOptions{Level: level}, nil
}
