package curator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"connectrpc.com/vanguard"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/rpc"
)

// The admin API is also served over the Connect protocol (DESIGN §8), so
// that curl with JSON works:
//
//	curl --cacert ca.crt --cert admin.crt --key admin.key -H 'Content-Type: application/json' \
//	     -d '{}' https://HOST:PORT/curia.curator.v1.Management/GetClusterInfo
//
// A vanguard transcoder turns each Connect (or gRPC-Web) call into a gRPC
// call handed to this replica's own gRPC server in-process (its ServeHTTP),
// with the TLS state of the HTTP connection: the server's interceptors
// authenticate and authorize the caller from its certificate, forward to the
// leader and map errors exactly as for a gRPC client. Nothing here decides
// who may call what. The listener has the same mutual TLS.

// serveConnect serves Connect on lis until ctx ends.
func (s *Service) serveConnect(ctx context.Context, lis net.Listener) error {
	mgmt := vanguard.NewService(curatorv1.Management_ServiceDesc.ServiceName, s.rpc.GRPC(),
		vanguard.WithTargetProtocols(vanguard.ProtocolGRPC),
		vanguard.WithTargetCodecs(vanguard.CodecProto))
	transcoder, err := vanguard.NewTranscoder([]*vanguard.Service{mgmt})
	if err != nil {
		return fmt.Errorf("connect transcoder: %w", err)
	}
	tlsConfig := rpc.ServerTLSConfig(s.creds, s.crl.IsRevoked)
	tlsConfig.NextProtos = []string{"h2", "http/1.1"}
	hs := &http.Server{Handler: requireClientCert(transcoder), TLSConfig: tlsConfig, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		// ctx is done: the requests in flight get 5s of their own.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			hs.Close() // the 5s passed: cut the connections left
		}
	}()
	s.log.Info("admin API over Connect", "listen", lis.Addr().String())
	if err := hs.ServeTLS(lis, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// requireClientCert refuses requests without a verified client certificate
// before they reach the transcoder (the gRPC server refuses them too; this
// answers with a plain HTTP 401 that says why). A unary POST of JSON or
// protobuf is a Connect call even without the Connect-Protocol-Version
// header, as connect-go servers take it, so plain curl works; without it
// vanguard would take it for REST, which this API does not map.
func requireClientCert(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "a client certificate of the cluster CA is required", http.StatusUnauthorized)
			return
		}
		if ct := r.Header.Get("Content-Type"); r.Method == http.MethodPost && r.Header.Get("Connect-Protocol-Version") == "" &&
			(ct == "application/json" || ct == "application/proto") {
			r.Header.Set("Connect-Protocol-Version", "1")
		}
		next.ServeHTTP(w, r)
	})
}
