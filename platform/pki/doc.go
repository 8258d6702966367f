// Package pki is curia's public key infrastructure (DESIGN §2): one cluster
// CA, certificates whose only identity is a SPIFFE URI SAN, CRLs, and the on-disk
// layout the curia-pki tool writes and the services read.
//
//	NewCA ──▶ CA ──Issue(IssueRequest)──▶ Issued{cert, key}   (mTLS, TLS 1.3)
//	           └──CRL(revoked)──────────▶ CRL PEM ──VerifyCRL──▶ servers
//
// Every leaf certificate carries exactly one URI SAN,
// spiffe://<cluster>/<kind>[/<name>], read back by PrincipalFromCert, and a
// subject CommonName equal to the kind, because etcd's --client-cert-allowed-cn
// style checks look only at the CN. Leaves are good for both server and client
// auth: etcd peers dial and accept with the same certificate.
//
// A PKI directory holds
//
//	cluster                  the cluster name (trust domain)
//	ca.crt  ca.key           the CA (key 0600)
//	<base>.crt  <base>.key   one pair per principal, base from FileBase:
//	                         admin-<name>, curator, reconciler,
//	                         node-<hex> (the node id), consensus-node-<hex>
//	node-<hex>.ed25519.key   a node's identity key (0600), see NodeKeyFile
package pki
