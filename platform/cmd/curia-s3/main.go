// Command curia-s3 serves an S3-compatible object storage that keeps its
// objects on disk (platform/offsite/offsitetest over gofakes3), for local
// and development clusters: the target of the curators'
// --snapshot-offsite. It checks no credentials and speaks plain HTTP:
// never a production store.
//
//	curia-s3 --dir .curia/s3 --listen 127.0.0.1:9000 --bucket backups
//	curator ... --snapshot-offsite s3://backups/dev --s3-endpoint 127.0.0.1:9000 --s3-insecure
//
// A static binary (CGO_ENABLED=0), fit for a FROM scratch image.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"curia.dev/platform/offsite/offsitetest"
	"curia.dev/platform/run"
)

// Config configures the server.
type Config struct {
	// Dir holds the objects; Listen is the plain-HTTP address; Buckets
	// are created at start (those there already are kept).
	Dir     string
	Listen  string
	Buckets []string
}

// AddFlags registers the flags.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Dir, "dir", c.Dir, "directory of the objects (created when missing)")
	fs.StringVar(&c.Listen, "listen", c.Listen, "plain-HTTP address (host:port)")
	run.ListFlag(fs, "bucket", "bucket to create at start", &c.Buckets)
}

// Validate checks the flags.
func (c Config) Validate() error {
	if c.Dir == "" {
		return errors.New("--dir is required")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--listen %q: %w", c.Listen, err)
	}
	return nil
}

// server is the running store.
type server struct {
	cfg Config
	h   http.Handler
	log *slog.Logger
}

func newServer(cfg Config, log *slog.Logger) (*server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h, err := offsitetest.Handler(cfg.Dir, cfg.Buckets...)
	if err != nil {
		return nil, err
	}
	return &server{cfg: cfg, h: h, log: log.With("component", "curia-s3")}, nil
}

// Run serves until ctx ends.
func (s *server) Run(ctx context.Context) error {
	lis, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	s.log.Info("serving S3", "addr", lis.Addr().String(), "dir", s.cfg.Dir, "buckets", s.cfg.Buckets)
	if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func main() {
	cfg := Config{Listen: "127.0.0.1:9000"}
	run.Main("curia-s3", func(fs *flag.FlagSet) { cfg.AddFlags(fs) }, func(log *slog.Logger) (run.Service, error) {
		return newServer(cfg, log)
	})
}
