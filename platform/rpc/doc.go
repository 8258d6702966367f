// Package rpc builds curia's gRPC servers and clients: mutual TLS 1.3 with
// the cluster CA, SPIFFE identities mapped to principals by pki, one
// authorization policy per server, and the same interceptor chain everywhere.
//
// A call through a Server passes, outermost first:
//
//	TLS handshake     client certificate verified against the cluster CA (and
//	   │              the CRL, if any), or with AllowEnrolling a self-signed
//	   │              ed25519 one; no certificate, no connection
//	1 recovery        a panic below becomes codes.Internal, logged with its stack
//	2 metrics         grpc_server_* on the server's private Prometheus registry
//	3 logging         one line per call: method, principal, code, duration
//	4 authn/authz     certificate → pki.Principal (Unauthenticated if none;
//	   │              enrolling/<node-id> for a self-signed one); from a
//	   │              TrustForwardedFrom peer, the forwarded principal instead
//	   │              (PermissionDenied from anyone else);
//	   │              Policy[method] → PermissionDenied unless allowed
//	5 validation      the protovalidate rules of proto/ → InvalidArgument
//	   │              naming field and rule, google.rpc.BadRequest details
//	   ▼
//	handler           rpc.PrincipalFromContext(ctx) says who is calling,
//	                  rpc.ForwarderFromContext(ctx) who forwarded the call
//
// Every server also serves gRPC health (overall status "" starts NOT_SERVING;
// the service flips it once ready, see ExampleNewServer) and reflection v1 and
// v1alpha, open to every authenticated principal so that grpcurl works with
// -cacert, -cert and -key alone. Metrics live on a private registry, served
// by MetricsHandler.
//
// Clients (Dial, and DialEnrolling for nodes without a certificate yet)
// verify the server the same way the server verifies them: by chain and
// principal, not by hostname.
package rpc
