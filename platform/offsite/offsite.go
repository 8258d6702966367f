// Package offsite keeps copies of etcd snapshots (platform/snapshots) in
// S3-compatible object storage, off the machines of the cluster: the
// curator leader uploads each snapshot it took
// (services/curator/internal/snaps), and recovery fetches one back.
//
//	s3://<bucket>/<prefix>/<snapshot name>
//	        the snapshot's .db as is (etcd's database and its sha256),
//	        with user metadata: its sha256, size, revision, cluster,
//	        when it was taken and by whom
//
// An upload is verified: the local file hashes to its metadata's sha256
// before it is sent, and once stored a HEAD of the object must show its
// size and sha256. A fetch writes to a temporary file beside the
// destination and renames it into place only once its size and sha256
// match the object's metadata: never a half-written or corrupted file.
//
// Objects under the prefix whose names are no snapshot's are not ours:
// List ignores them and the retention never deletes them.
package offsite

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"curia.dev/platform/snapshots"
)

// Scheme is the scheme of a target URL.
const Scheme = "s3"

// The environment variables Options.FromEnv reads.
const (
	EnvEndpoint  = "CURIA_S3_ENDPOINT"
	EnvAccessKey = "CURIA_S3_ACCESS_KEY"
	EnvSecretKey = "CURIA_S3_SECRET_KEY" //nolint:gosec // G101: the name of the variable that holds it, no secret
	// EnvInsecure=true is --s3-insecure (plain HTTP, development only),
	// for the commands that take no such flag (make recover).
	EnvInsecure = "CURIA_S3_INSECURE"
)

// User metadata keys (x-amz-meta-<key>) of an uploaded snapshot.
const (
	metaSHA256   = "Curia-Sha256"
	metaSize     = "Curia-Size"
	metaRevision = "Curia-Revision"
	metaCluster  = "Curia-Cluster"
	metaTakenAt  = "Curia-Taken-At"
	metaTakenBy  = "Curia-Taken-By"
)

// Errors callers may tell apart.
var (
	// ErrBadURL: a target URL that is not s3://bucket[/prefix].
	ErrBadURL = errors.New("bad off-site URL")
	// ErrNotFound: no such snapshot (or none at all) off-site.
	ErrNotFound = errors.New("no such snapshot off-site")
	// ErrMismatch: an object that is not what its metadata says.
	ErrMismatch = errors.New("off-site snapshot does not match its metadata")
)

// Target is where snapshots are kept: a bucket, and a prefix in it ("" or
// a path without leading or trailing slash).
type Target struct {
	Bucket string
	Prefix string
}

// String is the target as a URL.
func (t Target) String() string { return t.URL("") }

// Key is the object key of the named snapshot.
func (t Target) Key(name string) string {
	if t.Prefix == "" {
		return name
	}
	return t.Prefix + "/" + name
}

// URL is the URL of the named snapshot (of the target when name is "").
func (t Target) URL(name string) string {
	u := Scheme + "://" + t.Bucket
	if t.Prefix != "" {
		u += "/" + t.Prefix
	}
	if name != "" {
		u += "/" + name
	}
	return u
}

// ParseURL parses s3://bucket[/prefix][/snapshot name]. When the last part
// of the path is a snapshot's name (snapshots.ParseName), it is returned
// as name and the rest is the prefix; else the whole path is the prefix.
func ParseURL(raw string) (t Target, name string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Target{}, "", fmt.Errorf("%w %q: %v", ErrBadURL, raw, err)
	}
	if u.Scheme != Scheme {
		return Target{}, "", fmt.Errorf("%w %q: the scheme must be %s:// (s3://bucket/prefix)", ErrBadURL, raw, Scheme)
	}
	if u.Host == "" {
		return Target{}, "", fmt.Errorf("%w %q: no bucket (s3://bucket/prefix)", ErrBadURL, raw)
	}
	if u.User != nil || u.Port() != "" || u.RawQuery != "" || u.Fragment != "" {
		return Target{}, "", fmt.Errorf("%w %q: only s3://bucket/prefix: credentials and the endpoint are options of their own", ErrBadURL, raw)
	}
	if err := validBucket(u.Host); err != nil {
		return Target{}, "", fmt.Errorf("%w %q: %v", ErrBadURL, raw, err)
	}
	p := strings.Trim(u.Path, "/")
	if strings.Contains(p, "//") || slices.Contains(strings.Split(p, "/"), "..") || slices.Contains(strings.Split(p, "/"), ".") {
		return Target{}, "", fmt.Errorf("%w %q: the prefix has an empty, . or .. part", ErrBadURL, raw)
	}
	if base := path.Base(p); p != "" {
		if _, _, err := snapshots.ParseName(base); err == nil {
			name = base
			p = strings.TrimSuffix(strings.TrimSuffix(p, base), "/")
		}
	}
	return Target{Bucket: u.Host, Prefix: p}, name, nil
}

// validBucket checks S3's bucket naming rules, enough to catch typos.
func validBucket(b string) error {
	if len(b) < 3 || len(b) > 63 {
		return fmt.Errorf("bucket %q: 3 to 63 characters", b)
	}
	for _, r := range b {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' && r != '.' {
			return fmt.Errorf("bucket %q: only lower-case letters, digits, '-' and '.'", b)
		}
	}
	return nil
}

// Options are how to reach the object storage.
type Options struct {
	// Endpoint is the server, host:port or http(s)://host:port.
	Endpoint string
	// AccessKey and SecretKey are the credentials; none: anonymous.
	AccessKey string
	SecretKey string
	// Region, when the server wants one ("" lets the client find out).
	Region string
	// Insecure talks plain HTTP (local and development servers only).
	Insecure bool
	// CA is a PEM file of the CAs to trust over HTTPS, besides the
	// system's.
	CA string
}

// AddFlags registers the options as --<prefix>s3-… flags. The
// credentials' flags are empty by default: FromEnv fills them (and the
// endpoint) from the environment, so that no secret shows in a process
// list or in -h.
func (o *Options) AddFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&o.Endpoint, prefix+"s3-endpoint", o.Endpoint, "S3-compatible object storage server, host:port or https://host:port (default $"+EnvEndpoint+")")
	fs.StringVar(&o.AccessKey, prefix+"s3-access-key", o.AccessKey, "access key of the object storage (default $"+EnvAccessKey+")")
	fs.StringVar(&o.SecretKey, prefix+"s3-secret-key", o.SecretKey, "secret key of the object storage (default $"+EnvSecretKey+", which is better: a flag shows in the process list)")
	fs.StringVar(&o.Region, prefix+"s3-region", o.Region, "region of the object storage (default: asked of the server)")
	fs.BoolVar(&o.Insecure, prefix+"s3-insecure", o.Insecure, "talk plain HTTP to the object storage (local and development servers only)")
	fs.StringVar(&o.CA, prefix+"s3-ca", o.CA, "PEM file of CAs to trust for the object storage's HTTPS, besides the system's")
}

// FromEnv returns o with its empty endpoint and credentials taken from
// $CURIA_S3_ENDPOINT, $CURIA_S3_ACCESS_KEY and $CURIA_S3_SECRET_KEY, and
// Insecure set by $CURIA_S3_INSECURE=true.
func (o Options) FromEnv() Options {
	fill := func(v *string, env string) {
		if *v == "" {
			*v = os.Getenv(env)
		}
	}
	fill(&o.Endpoint, EnvEndpoint)
	fill(&o.AccessKey, EnvAccessKey)
	fill(&o.SecretKey, EnvSecretKey)
	if os.Getenv(EnvInsecure) == "true" {
		o.Insecure = true
	}
	return o
}

// Validate checks the options (after FromEnv).
func (o Options) Validate() error {
	if o.Endpoint == "" {
		return fmt.Errorf("no object storage endpoint: set --s3-endpoint or $%s (host:port)", EnvEndpoint)
	}
	if _, _, err := o.endpoint(); err != nil {
		return err
	}
	if (o.AccessKey == "") != (o.SecretKey == "") {
		return fmt.Errorf("an access key without a secret key, or the reverse: set both (--s3-access-key and $%s) or neither (anonymous)", EnvSecretKey)
	}
	if o.Insecure && o.CA != "" {
		return errors.New("--s3-insecure (plain HTTP) and --s3-ca (a CA for HTTPS) contradict each other")
	}
	return nil
}

// endpoint is the server's host:port, and whether it is HTTPS.
func (o Options) endpoint() (string, bool, error) {
	e, secure := o.Endpoint, !o.Insecure
	if strings.Contains(e, "://") {
		u, err := url.Parse(e)
		if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") || (u.Scheme != "http" && u.Scheme != "https") {
			return "", false, fmt.Errorf("object storage endpoint %q: host:port, http://host:port or https://host:port", o.Endpoint)
		}
		if u.Scheme == "http" && !o.Insecure {
			return "", false, fmt.Errorf("object storage endpoint %q is plain HTTP: add --s3-insecure if that is meant (local and development servers only)", o.Endpoint)
		}
		if u.Scheme == "https" && o.Insecure {
			return "", false, fmt.Errorf("object storage endpoint %q is HTTPS, but --s3-insecure asks for plain HTTP", o.Endpoint)
		}
		e = u.Host
	}
	if strings.ContainsAny(e, "/?#@ ") {
		return "", false, fmt.Errorf("object storage endpoint %q: host:port, http://host:port or https://host:port", o.Endpoint)
	}
	return e, secure, nil
}

// Metadata describes a snapshot off-site, as its object's metadata says.
type Metadata struct {
	// Name is the snapshot's name, URL the object's s3:// URL.
	Name string
	URL  string
	// Size and SHA256 (hex) are the .db file's, as uploaded.
	Size   int64
	SHA256 string
	// Revision, Cluster, TakenAt and TakenBy are the snapshot's.
	Revision int64
	Cluster  string
	TakenAt  time.Time
	TakenBy  string
	// Uploaded is when the object was stored (its last modification).
	Uploaded time.Time
}

// Client reaches one target.
type Client struct {
	target Target
	mc     *minio.Client
}

// New is a client of target (s3://bucket[/prefix]) with opts, after
// FromEnv. It makes no call.
func New(target string, opts Options) (*Client, error) {
	t, name, err := ParseURL(target)
	if err != nil {
		return nil, err
	}
	if name != "" {
		return nil, fmt.Errorf("%w %q: names a snapshot; the target is a bucket and prefix", ErrBadURL, target)
	}
	return newClient(t, opts.FromEnv())
}

func newClient(t Target, opts Options) (*Client, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	host, secure, _ := opts.endpoint()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if opts.CA != "" {
		pem, err := os.ReadFile(opts.CA)
		if err != nil {
			return nil, fmt.Errorf("object storage CA: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("object storage CA %s: no PEM certificate in it", opts.CA)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	var creds *credentials.Credentials
	if opts.AccessKey != "" {
		creds = credentials.NewStaticV4(opts.AccessKey, opts.SecretKey, "")
	} else {
		creds = credentials.NewStatic("", "", "", credentials.SignatureAnonymous)
	}
	mc, err := minio.New(host, &minio.Options{
		Creds: creds, Secure: secure, Transport: tr, Region: opts.Region,
		// Path-style requests (host/bucket/key) work with every
		// S3-compatible server; virtual hosts need DNS for each bucket.
		BucketLookup: minio.BucketLookupPath,
		MaxRetries:   3,
	})
	if err != nil {
		return nil, fmt.Errorf("object storage client for %s: %w", opts.Endpoint, err)
	}
	return &Client{target: t, mc: mc}, nil
}

// Target is the client's target.
func (c *Client) Target() Target { return c.target }

// Upload stores the snapshot md, whose .db is at file, as the object of its
// name: it checks that the file is what md says (size, sha256), sends it,
// then HEADs the object, which must show the same size and sha256. An
// object of that name with the same size and sha256 is left as it is.
func (c *Client) Upload(ctx context.Context, md snapshots.Metadata, file string) (Metadata, error) {
	key := c.target.Key(md.Name)
	if got, err := c.stat(ctx, md.Name); err == nil && got.Size == md.Size && got.SHA256 == md.SHA256 {
		return got, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return Metadata{}, fmt.Errorf("upload snapshot %s: %w", md.Name, err)
	}
	defer f.Close()
	size, sum, err := hashFile(f)
	if err != nil {
		return Metadata{}, fmt.Errorf("upload snapshot %s: read %s: %w", md.Name, file, err)
	}
	if size != md.Size || sum != md.SHA256 {
		return Metadata{}, fmt.Errorf("upload snapshot %s: %s is %d bytes of sha256 %s, its metadata says %d bytes of %s: %w", md.Name, file, size, sum, md.Size, md.SHA256, ErrMismatch)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Metadata{}, fmt.Errorf("upload snapshot %s: %w", md.Name, err)
	}
	_, err = c.mc.PutObject(ctx, c.target.Bucket, key, f, size, minio.PutObjectOptions{
		ContentType: "application/octet-stream",
		UserMetadata: map[string]string{
			metaSHA256: md.SHA256, metaSize: strconv.FormatInt(md.Size, 10),
			metaRevision: strconv.FormatInt(md.Revision, 10), metaCluster: md.Cluster,
			metaTakenAt: md.TakenAt.UTC().Format(time.RFC3339Nano), metaTakenBy: md.TakenBy,
		},
		// The server checks the body against its MD5 as it stores it.
		SendContentMd5: true,
	})
	if err != nil {
		return Metadata{}, fmt.Errorf("upload snapshot %s to %s: %w", md.Name, c.target.URL(md.Name), err)
	}
	got, err := c.stat(ctx, md.Name)
	if err != nil {
		return Metadata{}, fmt.Errorf("upload snapshot %s: check the object after the upload: %w", md.Name, err)
	}
	if got.Size != md.Size || got.SHA256 != md.SHA256 {
		return Metadata{}, fmt.Errorf("upload snapshot %s: after the upload %s is %d bytes of sha256 %q, want %d bytes of %s: %w", md.Name, got.URL, got.Size, got.SHA256, md.Size, md.SHA256, ErrMismatch)
	}
	return got, nil
}

// hashFile is the size and hex sha256 of what is left to read of f.
func hashFile(r io.Reader) (int64, string, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return n, hex.EncodeToString(h.Sum(nil)), err
}

// Stat is the metadata of the named snapshot off-site (ErrNotFound when
// it is not there).
func (c *Client) Stat(ctx context.Context, name string) (Metadata, error) {
	if _, _, err := snapshots.ParseName(name); err != nil {
		return Metadata{}, err
	}
	return c.stat(ctx, name)
}

func (c *Client) stat(ctx context.Context, name string) (Metadata, error) {
	info, err := c.mc.StatObject(ctx, c.target.Bucket, c.target.Key(name), minio.StatObjectOptions{})
	if err != nil {
		if isNotFound(err) {
			return Metadata{}, fmt.Errorf("%w: %s", ErrNotFound, c.target.URL(name))
		}
		return Metadata{}, fmt.Errorf("stat %s: %w", c.target.URL(name), err)
	}
	return c.metadata(name, info), nil
}

// metadata reads an object's user metadata. What does not parse stays
// zero: Fetch then refuses the object.
func (c *Client) metadata(name string, info minio.ObjectInfo) Metadata {
	get := func(k string) string {
		for mk, v := range info.UserMetadata {
			if strings.EqualFold(mk, k) {
				return v
			}
		}
		return ""
	}
	md := Metadata{Name: name, URL: c.target.URL(name), Size: info.Size, SHA256: get(metaSHA256),
		Cluster: get(metaCluster), TakenBy: get(metaTakenBy), Uploaded: info.LastModified}
	md.Revision, _ = strconv.ParseInt(get(metaRevision), 10, 64)
	md.TakenAt, _ = time.Parse(time.RFC3339Nano, get(metaTakenAt))
	if md.TakenAt.IsZero() || md.Revision == 0 {
		t, rev, _ := snapshots.ParseName(name) // checked by the caller
		md.TakenAt, md.Revision = t, rev
	}
	return md
}

func isNotFound(err error) bool {
	code := minio.ToErrorResponse(err).Code
	return code == minio.NoSuchKey || code == "NotFound"
}

// Names are the names of the snapshots off-site, newest first (by the
// time and revision in their names), without a call per object.
func (c *Client) Names(ctx context.Context) ([]string, error) {
	prefix := c.target.Prefix
	if prefix != "" {
		prefix += "/"
	}
	type entry struct {
		name string
		t    time.Time
		rev  int64
	}
	var list []entry
	for obj := range c.mc.ListObjects(ctx, c.target.Bucket, minio.ListObjectsOptions{Prefix: prefix}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list %s: %w", c.target, obj.Err)
		}
		name := strings.TrimPrefix(obj.Key, prefix)
		if t, rev, err := snapshots.ParseName(name); err == nil {
			list = append(list, entry{name, t, rev})
		}
	}
	slices.SortFunc(list, func(a, b entry) int {
		if c := b.t.Compare(a.t); c != 0 {
			return c
		}
		return cmp.Compare(b.rev, a.rev)
	})
	out := make([]string, len(list))
	for i, e := range list {
		out[i] = e.name
	}
	return out, nil
}

// List is the snapshots off-site with their metadata, newest first: a
// listing, then a HEAD per snapshot.
func (c *Client) List(ctx context.Context) ([]Metadata, error) {
	names, err := c.Names(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Metadata, 0, len(names))
	for _, name := range names {
		md, err := c.stat(ctx, name)
		if errors.Is(err, ErrNotFound) { // deleted meanwhile
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, md)
	}
	return out, nil
}

// Prune applies the retention: it keeps the keep newest snapshots
// off-site, and spare (the one just uploaded) whatever its age, and
// deletes the others. It returns the names it deleted; it stops at the
// first failure.
func (c *Client) Prune(ctx context.Context, keep int, spare string) ([]string, error) {
	if keep < 1 {
		return nil, fmt.Errorf("off-site retention: keep %d, at least 1", keep)
	}
	names, err := c.Names(ctx)
	if err != nil {
		return nil, err
	}
	var deleted []string
	for i, name := range names {
		if i < keep || name == spare {
			continue
		}
		if err := c.mc.RemoveObject(ctx, c.target.Bucket, c.target.Key(name), minio.RemoveObjectOptions{}); err != nil {
			return deleted, fmt.Errorf("delete %s: %w", c.target.URL(name), err)
		}
		deleted = append(deleted, name)
	}
	return deleted, nil
}

// Fetch downloads the named snapshot, or the newest when name is "", into
// dst. The bytes go to a temporary file beside dst, which is renamed into
// place once its size and sha256 match the object's metadata, and synced:
// dst is the whole, verified snapshot or is not written at all.
func (c *Client) Fetch(ctx context.Context, name, dst string) (Metadata, error) {
	if name == "" {
		names, err := c.Names(ctx)
		if err != nil {
			return Metadata{}, err
		}
		if len(names) == 0 {
			return Metadata{}, fmt.Errorf("%w: %s holds none", ErrNotFound, c.target)
		}
		name = names[0]
	}
	md, err := c.Stat(ctx, name)
	if err != nil {
		return Metadata{}, err
	}
	if len(md.SHA256) != 2*sha256.Size {
		return Metadata{}, fmt.Errorf("fetch %s: the object has no sha256 in its metadata (%q), so it cannot be checked: %w", md.URL, md.SHA256, ErrMismatch)
	}
	obj, err := c.mc.GetObject(ctx, c.target.Bucket, c.target.Key(name), minio.GetObjectOptions{})
	if err != nil {
		return Metadata{}, fmt.Errorf("fetch %s: %w", md.URL, err)
	}
	defer obj.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*"+snapshots.PartExt)
	if err != nil {
		return Metadata{}, fmt.Errorf("fetch %s: %w", md.URL, err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), obj)
	if err != nil {
		return Metadata{}, fmt.Errorf("fetch %s into %s: %w", md.URL, tmp.Name(), err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); n != md.Size || sum != md.SHA256 {
		return Metadata{}, fmt.Errorf("fetch %s: got %d bytes of sha256 %s, its metadata says %d bytes of %s; %s is not written: %w", md.URL, n, sum, md.Size, md.SHA256, dst, ErrMismatch)
	}
	if err := tmp.Sync(); err != nil {
		return Metadata{}, fmt.Errorf("fetch %s: sync %s: %w", md.URL, tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return Metadata{}, fmt.Errorf("fetch %s: %w", md.URL, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return Metadata{}, fmt.Errorf("fetch %s: %w", md.URL, err)
	}
	done = true
	if err := snapshots.SyncDir(filepath.Dir(dst)); err != nil {
		return Metadata{}, fmt.Errorf("fetch %s: sync the directory of %s: %w", md.URL, dst, err)
	}
	return md, nil
}

// Fetch downloads the snapshot that url names (s3://bucket/prefix/NAME),
// or the newest under a prefix (s3://bucket/prefix), into dst, verified
// (Client.Fetch). opts are taken FromEnv.
func Fetch(ctx context.Context, url string, opts Options, dst string) (Metadata, error) {
	t, name, err := ParseURL(url)
	if err != nil {
		return Metadata{}, err
	}
	c, err := newClient(t, opts.FromEnv())
	if err != nil {
		return Metadata{}, err
	}
	return c.Fetch(ctx, name, dst)
}
