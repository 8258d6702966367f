// Command curia-probe is the health probe of curia's servers: it dials one
// server with mutual TLS (any certificate of the cluster CA will do) and asks
// grpc.health.v1.Health/Check. It exits 0 when the server answers SERVING, 1
// when it answers anything else or cannot be reached in time, and 2 when the
// probe itself is misconfigured (flags, unreadable or foreign certificates).
//
// With --http it asks a plain-HTTP health endpoint on loopback instead
// (consensus --listen-metrics serves /healthz), for a process whose
// container holds no certificate a server of the CA would take: a node's
// idle consensus process, which has none until its agent installs one.
//
// With --live it is a liveness probe: it exits 0 when the server answers
// at all, whatever the status. Every curia server reports SERVING only once
// it can do its job (a curator once it reached etcd, a member once its
// quorum is back, an agent once it is approved), which can take as long as
// another part of the cluster is away: a process that waits for it is alive,
// and restarting it would only delay it. Only a server that does not answer
// in time (wedged, or its listener gone) fails.
//
// It is what the compose cluster's health checks run: its images are FROM
// scratch, without a shell or curl; Kubernetes' probes run it too.
//
//	curia-probe --addr 127.0.0.1:7200 --ca ca.crt --cert curator.crt --key curator.key
//	curia-probe --http http://127.0.0.1:9100/healthz
//	curia-probe --live --http http://127.0.0.1:9100/healthz
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"google.golang.org/grpc/health/grpc_health_v1"

	"curia.dev/platform/rpc"
	"curia.dev/platform/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("curia-probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "server address host:port (any gRPC target, e.g. dns:///curator:7200)")
	cluster := fs.String("cluster", "curia", "cluster name (trust domain of every identity)")
	var files rpc.TLSFiles
	files.AddFlags(fs, "")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	service := fs.String("service", "", "health service name to check (empty: the server as a whole)")
	quiet := fs.Bool("quiet", false, "print nothing when the server is SERVING")
	httpURL := fs.String("http", "", "ask this plain-HTTP health URL (loopback) instead of gRPC health over mTLS")
	live := fs.Bool("live", false, "liveness: exit 0 when the server answers at all, whatever its health status (one waiting for etcd, its quorum or its approval is alive); 1 only without an answer in time")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showVersion {
		version.Print(stdout, "curia-probe")
		return 0
	}
	if *httpURL != "" {
		return probeHTTP(*httpURL, *timeout, *live, *quiet, stdout, stderr)
	}
	if *addr == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "curia-probe: --addr is required, and nothing else is accepted")
		return 2
	}
	creds, err := rpc.LoadCredentials(*cluster, files)
	if err != nil {
		fmt.Fprintln(stderr, "curia-probe:", err)
		return 2
	}
	conn, err := rpc.Dial(*addr, rpc.ClientConfig{Credentials: creds})
	if err != nil {
		fmt.Fprintln(stderr, "curia-probe:", err)
		return 2
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	resp, err := grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: *service})
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %v: %w", *timeout, err)
		}
		fmt.Fprintf(stderr, "curia-probe: %s: %v\n", *addr, err)
		return 1
	}
	if resp.GetStatus() != grpc_health_v1.HealthCheckResponse_SERVING && !*live {
		fmt.Fprintf(stderr, "curia-probe: %s: %s\n", *addr, resp.GetStatus())
		return 1
	}
	if !*quiet {
		fmt.Fprintf(stdout, "%s: %s\n", *addr, resp.GetStatus())
	}
	return 0
}

// probeHTTP asks a plain-HTTP health endpoint: 200 is SERVING (live: any
// answer is).
func probeHTTP(url string, timeout time.Duration, live, quiet bool, stdout, stderr io.Writer) int {
	resp, err := (&http.Client{Timeout: timeout}).Get(url)
	if err != nil {
		fmt.Fprintf(stderr, "curia-probe: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK && !live {
		fmt.Fprintf(stderr, "curia-probe: %s: %s %s\n", url, resp.Status, body)
		return 1
	}
	if !quiet {
		fmt.Fprintf(stdout, "%s: %s %s\n", url, resp.Status, bytes.TrimSpace(body))
	}
	return 0
}
