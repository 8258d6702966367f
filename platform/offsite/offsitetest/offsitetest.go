// Package offsitetest serves a real S3-compatible object storage from Go
// (gofakes3) that keeps its objects on disk, for tests of
// platform/offsite and its users, and for the dev command curia-s3. It
// checks no signature: any credentials do.
//
//	<dir>/buckets/<bucket>/<key>    each object's bytes, as is
//	<dir>/metadata/...              each object's metadata (JSON)
package offsitetest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3afero"
	"github.com/spf13/afero"

	"curia.dev/platform/offsite"
)

// Handler is an S3 server whose objects are kept under dir, with the
// buckets created (those there already are kept).
func Handler(dir string, buckets ...string) (http.Handler, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	backend, err := s3afero.MultiBucket(afero.NewBasePathFs(afero.NewOsFs(), abs))
	if err != nil {
		return nil, fmt.Errorf("object storage in %s: %w", dir, err)
	}
	for _, b := range buckets {
		ok, err := backend.BucketExists(b)
		if err != nil {
			return nil, fmt.Errorf("bucket %s in %s: %w", b, dir, err)
		}
		if !ok {
			if err := backend.CreateBucket(b); err != nil {
				return nil, fmt.Errorf("create bucket %s in %s: %w", b, dir, err)
			}
		}
	}
	return unchunkParts(gofakes3.New(listing{backend}, gofakes3.WithoutVersioning()).Server()), nil
}

// streamingPayload marks a body in aws-chunked encoding, each chunk
// signed: what S3 clients send over plain HTTP.
const streamingPayload = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"

// unchunkParts decodes the aws-chunked body of a multipart upload's part
// before gofakes3 sees it: gofakes3 decodes a whole object's body, but
// stores a part's as is, chunk headers and all (v1.2.0).
func unchunkParts(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if r.Method == http.MethodPut && q.Has("uploadId") && q.Has("partNumber") && r.Header.Get("X-Amz-Content-Sha256") == streamingPayload {
			n, err := strconv.ParseInt(r.Header.Get("X-Amz-Decoded-Content-Length"), 10, 64)
			if err != nil {
				http.Error(w, "no X-Amz-Decoded-Content-Length", http.StatusBadRequest)
				return
			}
			r.Body = struct {
				io.Reader
				io.Closer
			}{&chunkedReader{r: bufio.NewReader(r.Body)}, r.Body}
			r.ContentLength = n
			r.Header.Set("Content-Length", strconv.FormatInt(n, 10))
			r.Header.Set("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")
		}
		next.ServeHTTP(w, r)
	})
}

// chunkedReader reads the data of an aws-chunked body:
// <hex size>;chunk-signature=<sig>\r\n<data>\r\n ..., ending with a chunk of
// size 0.
type chunkedReader struct {
	r    *bufio.Reader
	left int64 // of the current chunk
	done bool
}

func (c *chunkedReader) Read(p []byte) (int, error) {
	for c.left == 0 {
		if c.done {
			return 0, io.EOF
		}
		line, err := c.r.ReadString('\n')
		if err != nil {
			return 0, fmt.Errorf("aws-chunked header: %w", err)
		}
		size, _, _ := strings.Cut(strings.TrimSpace(line), ";")
		n, err := strconv.ParseInt(size, 16, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("aws-chunked header %q", line)
		}
		if n == 0 {
			c.done = true
			continue
		}
		c.left = n
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left == 0 && err == nil {
		if _, err := c.r.Discard(2); err != nil { // the chunk's \r\n
			return n, fmt.Errorf("aws-chunked data: %w", err)
		}
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// listing lists a prefix that names no directory (yet) as empty, as S3
// does; s3afero says the bucket does not exist.
type listing struct{ *s3afero.MultiBucketBackend }

func (l listing) ListBucket(bucket string, prefix *gofakes3.Prefix, page gofakes3.ListBucketPage) (*gofakes3.ObjectList, error) {
	list, err := l.MultiBucketBackend.ListBucket(bucket, prefix, page)
	if gofakes3.HasErrorCode(err, gofakes3.ErrNoSuchBucket) {
		if ok, berr := l.BucketExists(bucket); berr == nil && ok {
			return gofakes3.NewObjectList(), nil
		}
	}
	return list, err
}

// Server is an S3 server on 127.0.0.1 over plain HTTP.
type Server struct {
	// Endpoint is host:port.
	Endpoint string
	// Dir holds the objects (the package doc's layout).
	Dir string
}

// Start serves an S3 server with the buckets, its objects in a temporary
// directory of the test, until the test ends.
func Start(t testing.TB, buckets ...string) *Server {
	t.Helper()
	dir := t.TempDir()
	h, err := Handler(dir, buckets...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &Server{Endpoint: srv.Listener.Addr().String(), Dir: dir}
}

// Options reach the server.
func (s *Server) Options() offsite.Options {
	return offsite.Options{Endpoint: s.Endpoint, AccessKey: "test", SecretKey: "test-secret", Insecure: true}
}

// Flags are the curator's flags that reach the server.
func (s *Server) Flags() []string {
	return []string{"--s3-endpoint", s.Endpoint, "--s3-access-key", "test", "--s3-secret-key", "test-secret", "--s3-insecure"}
}

// ObjectFile is the file that holds the object's bytes.
func (s *Server) ObjectFile(bucket, key string) string {
	return filepath.Join(s.Dir, "buckets", bucket, filepath.FromSlash(key))
}
