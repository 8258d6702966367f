package offsite_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/offsite"
	"curia.dev/platform/offsite/offsitetest"
	"curia.dev/platform/snapshots"
)

const bucket = "curia-backups"

// snapshot writes a snapshot-like file of size random bytes into dir and
// returns its metadata (no etcd database: offsite reads only bytes).
func snapshot(t *testing.T, dir string, at time.Time, rev int64, size int) (snapshots.Metadata, []byte) {
	t.Helper()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	md := snapshots.Metadata{
		Name: snapshots.Name(at, rev), TakenAt: at.UTC(), Revision: rev, Size: int64(size),
		SHA256: hex.EncodeToString(sum[:]), Cluster: "test", TakenBy: "curator-0",
	}
	if err := os.WriteFile(snapshots.Dir(dir).DB(md.Name), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return md, data
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestRoundTrip: snapshots uploaded to a real S3 server on disk are
// listed newest first with their metadata, and fetched back byte for byte,
// by name or as the newest of the prefix; uploading one again changes
// nothing; an unknown name is ErrNotFound and writes nothing.
func TestRoundTrip(t *testing.T) {
	srv := offsitetest.Start(t, bucket)
	ctx := ctxT(t)
	c, err := offsite.New("s3://"+bucket+"/prod/snapshots", srv.Options())
	if err != nil {
		t.Fatal(err)
	}
	local := t.TempDir()
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	var mds []snapshots.Metadata
	var datas [][]byte
	for i, size := range []int{4096 + 32, 17<<20 + 32, 512 + 32} { // 17 MiB: a multipart upload (parts of 16 MiB)
		md, data := snapshot(t, local, base.Add(time.Duration(i)*time.Minute), int64(100+i), size)
		start := time.Now()
		up, err := c.Upload(ctx, md, snapshots.Dir(local).DB(md.Name))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("uploaded %d bytes in %v", size, time.Since(start).Round(time.Millisecond))
		if up.URL != "s3://"+bucket+"/prod/snapshots/"+md.Name || up.SHA256 != md.SHA256 || up.Size != md.Size || up.Revision != md.Revision || !up.TakenAt.Equal(md.TakenAt) || up.Cluster != "test" || up.TakenBy != "curator-0" {
			t.Fatalf("uploaded %+v, want the metadata of %+v", up, md)
		}
		mds, datas = append(mds, md), append(datas, data)
	}
	// The object is the file, as is, where the server keeps it.
	onDisk, err := os.ReadFile(srv.ObjectFile(bucket, "prod/snapshots/"+mds[0].Name))
	if err != nil || !bytes.Equal(onDisk, datas[0]) {
		t.Fatalf("the server's file of %s: %d bytes (%v), want the %d uploaded", mds[0].Name, len(onDisk), err, len(datas[0]))
	}
	// Again: the same object, nothing sent.
	if _, err := c.Upload(ctx, mds[1], snapshots.Dir(local).DB(mds[1].Name)); err != nil {
		t.Fatal(err)
	}

	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, md := range list {
		names = append(names, md.Name)
	}
	if want := []string{mds[2].Name, mds[1].Name, mds[0].Name}; !slices.Equal(names, want) {
		t.Fatalf("List: %v, want %v", names, want)
	}
	if list[1].Size != mds[1].Size || list[1].SHA256 != mds[1].SHA256 || list[1].Uploaded.IsZero() {
		t.Fatalf("List's %s: %+v", mds[1].Name, list[1])
	}

	dst := filepath.Join(t.TempDir(), "restore.db")
	got, err := offsite.Fetch(ctx, "s3://"+bucket+"/prod/snapshots/"+mds[1].Name, srv.Options(), dst)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(dst); err != nil || !bytes.Equal(b, datas[1]) || got.Name != mds[1].Name {
		t.Fatalf("fetched %s: %d bytes (%v), want %s's %d", got.Name, len(b), err, mds[1].Name, len(datas[1]))
	}
	// The prefix alone: the newest.
	got, err = offsite.Fetch(ctx, "s3://"+bucket+"/prod/snapshots", srv.Options(), dst)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); got.Name != mds[2].Name || !bytes.Equal(b, datas[2]) {
		t.Fatalf("fetched %s (%d bytes), want the newest, %s", got.Name, len(b), mds[2].Name)
	}

	missing := filepath.Join(t.TempDir(), "missing.db")
	_, err = offsite.Fetch(ctx, "s3://"+bucket+"/prod/snapshots/"+snapshots.Name(base, 1), srv.Options(), missing)
	if !errors.Is(err, offsite.ErrNotFound) {
		t.Fatalf("fetch of an unknown snapshot: %v, want ErrNotFound", err)
	}
	_, err = offsite.Fetch(ctx, "s3://"+bucket+"/elsewhere", srv.Options(), missing)
	if !errors.Is(err, offsite.ErrNotFound) {
		t.Fatalf("fetch from an empty prefix: %v, want ErrNotFound", err)
	}
	noFiles(t, filepath.Dir(missing))

	// The server keeps its objects on disk: another server on its
	// directory serves them.
	h, err := offsitetest.Handler(srv.Dir, bucket)
	if err != nil {
		t.Fatal(err)
	}
	again := httptest.NewServer(h)
	defer again.Close()
	opts := srv.Options()
	opts.Endpoint = again.Listener.Addr().String()
	if _, err := offsite.Fetch(ctx, "s3://"+bucket+"/prod/snapshots/"+mds[0].Name, opts, dst); err != nil {
		t.Fatalf("after a restart of the server: %v", err)
	}
}

// noFiles fails unless dir is empty (no temporary file left behind).
func noFiles(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("%s holds %s", dir, e.Name())
	}
}

// TestFetchCorrupted: an object whose bytes changed behind the client's
// back (same size, or cut short) is refused with ErrMismatch, naming the
// sha256 or size, and neither the destination nor a temporary file is
// left; a destination that existed is left as it was.
func TestFetchCorrupted(t *testing.T) {
	srv := offsitetest.Start(t, bucket)
	ctx := ctxT(t)
	c, err := offsite.New("s3://"+bucket, srv.Options())
	if err != nil {
		t.Fatal(err)
	}
	local := t.TempDir()
	md, data := snapshot(t, local, time.Now(), 7, 64<<10+32)
	if _, err := c.Upload(ctx, md, snapshots.Dir(local).DB(md.Name)); err != nil {
		t.Fatal(err)
	}
	file := srv.ObjectFile(bucket, md.Name)
	for name, bad := range map[string][]byte{
		"flipped": func() []byte { b := bytes.Clone(data); b[len(b)/2] ^= 0xff; return b }(),
		"short":   data[:len(data)-1000],
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(file, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			out := t.TempDir()
			dst := filepath.Join(out, "restore.db")
			_, err := c.Fetch(ctx, md.Name, dst)
			if !errors.Is(err, offsite.ErrMismatch) || !strings.Contains(err.Error(), md.SHA256) || !strings.Contains(err.Error(), "is not written") {
				t.Fatalf("fetch of a corrupted object: %v, want ErrMismatch naming its sha256", err)
			}
			noFiles(t, out)
			// An existing destination stays as it was.
			if err := os.WriteFile(dst, []byte("before"), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Fetch(ctx, md.Name, dst); !errors.Is(err, offsite.ErrMismatch) {
				t.Fatalf("second fetch: %v", err)
			}
			if b, _ := os.ReadFile(dst); string(b) != "before" {
				t.Fatalf("the destination was overwritten with %d bytes", len(b))
			}
		})
	}
}

// TestUploadChecksTheFile: a file that is not what its metadata says is
// not uploaded.
func TestUploadChecksTheFile(t *testing.T) {
	srv := offsitetest.Start(t, bucket)
	ctx := ctxT(t)
	c, err := offsite.New("s3://"+bucket+"/p", srv.Options())
	if err != nil {
		t.Fatal(err)
	}
	local := t.TempDir()
	md, _ := snapshot(t, local, time.Now(), 9, 1024+32)
	md.SHA256 = strings.Repeat("0", 64)
	if _, err := c.Upload(ctx, md, snapshots.Dir(local).DB(md.Name)); !errors.Is(err, offsite.ErrMismatch) {
		t.Fatalf("upload of a file that is not its metadata's: %v, want ErrMismatch", err)
	}
	if names, err := c.Names(ctx); err != nil || len(names) != 0 {
		t.Fatalf("off-site after a refused upload: %v (%v)", names, err)
	}
}

// TestPrune: the retention keeps exactly the keep newest, and the one
// just uploaded whatever its age; objects that are no snapshots are left.
func TestPrune(t *testing.T) {
	srv := offsitetest.Start(t, bucket)
	ctx := ctxT(t)
	c, err := offsite.New("s3://"+bucket+"/p", srv.Options())
	if err != nil {
		t.Fatal(err)
	}
	local := t.TempDir()
	base := time.Now().Add(-time.Hour)
	var names []string // newest first
	for i := range 6 {
		md, _ := snapshot(t, local, base.Add(time.Duration(i)*time.Minute), int64(10+i), 512+32)
		if _, err := c.Upload(ctx, md, snapshots.Dir(local).DB(md.Name)); err != nil {
			t.Fatal(err)
		}
		names = append([]string{md.Name}, names...)
	}
	// An object of someone else's under the prefix (a plain PUT: the
	// server checks no signature).
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+srv.Endpoint+"/"+bucket+"/p/README", strings.NewReader("not a snapshot"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT README: %s", resp.Status)
	}
	foreign := srv.ObjectFile(bucket, "p/README")
	deleted, err := c.Prune(ctx, 3, names[0])
	if err != nil {
		t.Fatal(err)
	}
	left, err := c.Names(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(left, names[:3]) || !slices.Equal(deleted, names[3:]) {
		t.Fatalf("keep 3: left %v, deleted %v; want %v left", left, deleted, names[:3])
	}
	// The one just uploaded is never deleted, even when older.
	if _, err := c.Prune(ctx, 1, names[2]); err != nil {
		t.Fatal(err)
	}
	if left, _ := c.Names(ctx); !slices.Equal(left, []string{names[0], names[2]}) {
		t.Fatalf("keep 1 sparing %s: left %v", names[2], left)
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Fatalf("an object that is no snapshot: %v", err)
	}
	if _, err := c.Prune(ctx, 0, ""); err == nil {
		t.Fatal("keep 0 accepted")
	}
}

// TestConfig: bad URLs and options are refused, saying what is wrong.
func TestConfig(t *testing.T) {
	good := offsite.Options{Endpoint: "127.0.0.1:9000", AccessKey: "a", SecretKey: "s", Insecure: true}
	for name, tc := range map[string]struct {
		url  string
		opts offsite.Options
		want string // in the error; "" for none
	}{
		"ok":               {"s3://bucket/prefix/more", good, ""},
		"no prefix":        {"s3://bucket", good, ""},
		"https endpoint":   {"s3://bucket", offsite.Options{Endpoint: "https://s3.example.com"}, ""},
		"scheme":           {"gs://bucket/prefix", good, "the scheme must be s3://"},
		"no scheme":        {"bucket/prefix", good, "the scheme must be s3://"},
		"no bucket":        {"s3:///prefix", good, "no bucket"},
		"bad bucket":       {"s3://My_Bucket/x", good, "only lower-case letters"},
		"port":             {"s3://bucket:9000/x", good, "only s3://bucket/prefix"},
		"dot dot":          {"s3://bucket/a/../b", good, ".. part"},
		"snapshot named":   {"s3://bucket/p/" + snapshots.Name(time.Now(), 5), good, "names a snapshot"},
		"no endpoint":      {"s3://bucket", offsite.Options{}, "--s3-endpoint"},
		"half credentials": {"s3://bucket", offsite.Options{Endpoint: "h:1", AccessKey: "a"}, "set both"},
		"http not allowed": {"s3://bucket", offsite.Options{Endpoint: "http://h:1"}, "--s3-insecure"},
		"bad endpoint":     {"s3://bucket", offsite.Options{Endpoint: "h:1/path", Insecure: true}, "host:port"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(offsite.EnvEndpoint, "")
			_, err := offsite.New(tc.url, tc.opts)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
	// The environment fills what the flags left empty.
	t.Setenv(offsite.EnvEndpoint, "minio:9000")
	t.Setenv(offsite.EnvAccessKey, "ak")
	t.Setenv(offsite.EnvSecretKey, "sk")
	o := offsite.Options{AccessKey: "flag"}.FromEnv()
	if o.Endpoint != "minio:9000" || o.AccessKey != "flag" || o.SecretKey != "sk" {
		t.Fatalf("FromEnv: %+v", o)
	}
	tgt, name, err := offsite.ParseURL("s3://b-1/a/b/" + snapshots.Name(time.Unix(0, 0), 3))
	if err != nil || tgt.Bucket != "b-1" || tgt.Prefix != "a/b" || name != "snapshot-19700101T000000Z-rev3" || tgt.URL(name) != "s3://b-1/a/b/"+name {
		t.Fatalf("ParseURL: %+v %q %v", tgt, name, err)
	}
}
