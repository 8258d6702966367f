// Package snapshots is the layout of a snapshot directory: the etcd
// snapshots the curator leader takes (services/curator/internal/snaps)
// and recovery reads. Several curators may share one directory; only the
// leader writes to it or deletes from it.
//
//	<dir>/snapshot-<UTC yyyymmddThhmmssZ>-rev<revision>.db
//	        the raw stream of etcd's Maintenance.Snapshot: etcd's bbolt
//	        database followed by its sha256, so that `etcdutl snapshot
//	        restore` verifies it (no --skip-hash-check)
//	<dir>/snapshot-<...>-rev<revision>.json
//	        its Metadata, written last, once the .db is verified
//	<dir>/*.part
//	        a file being written: written, synced, then renamed
//
// A .db without its .json is not a snapshot (a write that was cut short,
// or one that did not verify): List never shows it, and the leader removes
// it (Leftovers). Every file is written to a .part first, synced and
// renamed, so a crash leaves either the whole file or a .part.
package snapshots

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// File name parts.
const (
	// Prefix starts every snapshot's name.
	Prefix = "snapshot-"
	// DBExt and MetaExt end a snapshot's two files, PartExt a file being
	// written.
	DBExt   = ".db"
	MetaExt = ".json"
	PartExt = ".part"
	// timeLayout is the UTC time in a name.
	timeLayout = "20060102T150405Z"
)

// Trigger is why a snapshot was taken.
type Trigger string

// The triggers.
const (
	// Scheduled: the leader's schedule (--snapshot-interval).
	Scheduled Trigger = "scheduled"
	// OnDemand: someone called Management/TakeSnapshot.
	OnDemand Trigger = "on_demand"
	// BeforeMembershipChange: automation (the reconciler) asked for it
	// before it changes etcd membership.
	BeforeMembershipChange Trigger = "before_membership_change"
)

// Member is an etcd member as a snapshot's metadata records it.
type Member struct {
	// ID is the member id in hex, as etcdctl prints it.
	ID string `json:"id"`
	// Name is the member's name: in curia, its node's id. A learner that
	// never started has none in etcd; then it is the node its joining
	// record names, or empty.
	Name     string   `json:"name"`
	PeerURLs []string `json:"peer_urls"`
	Learner  bool     `json:"learner"`
}

// MemberID is the member id of m.
func (m Member) MemberID() (uint64, error) { return strconv.ParseUint(m.ID, 16, 64) }

// FormatID is a member id as Member.ID holds it.
func FormatID(id uint64) string { return strconv.FormatUint(id, 16) }

// Metadata describes one snapshot: the <name>.json file.
type Metadata struct {
	// Name is the snapshot's name, its files' name without extension.
	Name string `json:"name"`
	// TakenAt is when the snapshot was asked of etcd.
	TakenAt time.Time `json:"taken_at"`
	// Revision is the etcd revision the snapshot holds (etcdutl's).
	Revision int64 `json:"revision"`
	// Source is the member the snapshot was read from.
	Source Member `json:"source"`
	// Members is etcd's member list when the snapshot was taken.
	Members []Member `json:"members"`
	// Size is the .db file's size in bytes, SHA256 the hex sha256 of the
	// whole file (the trailer included).
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// EtcdHash, TotalKeys and StorageVersion are what etcdutl's snapshot
	// status reads from the database: the hash of its buckets, how many
	// keys it holds, etcd's storage version.
	EtcdHash       uint32 `json:"etcd_hash"`
	TotalKeys      int    `json:"total_keys"`
	StorageVersion string `json:"storage_version"`
	// Trigger and Reason say why the snapshot was taken: Reason is
	// "scheduled", "on demand by <identity>[: <their reason>]" or "before
	// membership change: <what>".
	Trigger Trigger `json:"trigger"`
	Reason  string  `json:"reason"`
	// RequestedBy is the identity that asked (empty when scheduled).
	RequestedBy string `json:"requested_by"`
	// TakenBy is the curator replica that took it, Cluster the cluster's
	// name.
	TakenBy string `json:"taken_by"`
	Cluster string `json:"cluster"`
}

var nameRE = regexp.MustCompile(`^snapshot-([0-9]{8}T[0-9]{6}Z)-rev([1-9][0-9]{0,18})$`)

// Name is the name of a snapshot taken at t of revision rev.
func Name(t time.Time, rev int64) string {
	return fmt.Sprintf("%s%s-rev%d", Prefix, t.UTC().Format(timeLayout), rev)
}

// ErrBadName: a name that is not a snapshot's.
var ErrBadName = errors.New("not a snapshot name")

// ParseName checks that name is a snapshot's name (and nothing else: no
// directory, no extension) and returns its time and revision.
func ParseName(name string) (time.Time, int64, error) {
	m := nameRE.FindStringSubmatch(name)
	if m == nil {
		return time.Time{}, 0, fmt.Errorf("%w: %q: a snapshot's name is snapshot-<UTC yyyymmddThhmmssZ>-rev<revision>, as ListSnapshots returns it, without directory or extension", ErrBadName, name)
	}
	t, err := time.Parse(timeLayout, m[1])
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("%w: %q: %v", ErrBadName, name, err)
	}
	rev, err := strconv.ParseInt(m[2], 10, 64)
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("%w: %q: %v", ErrBadName, name, err)
	}
	return t, rev, nil
}

// Dir is a snapshot directory.
type Dir string

// DB is the path of a snapshot's database, Meta of its metadata.
func (d Dir) DB(name string) string   { return filepath.Join(string(d), name+DBExt) }
func (d Dir) Meta(name string) string { return filepath.Join(string(d), name+MetaExt) }

// List returns the directory's snapshots, newest first: every .json that
// decodes, names itself and has its .db beside it. Anything else is not a
// snapshot and is left out.
func (d Dir) List() ([]Metadata, error) {
	entries, err := os.ReadDir(string(d))
	if err != nil {
		return nil, err
	}
	var out []Metadata
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), MetaExt)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if md, err := d.Read(name); err == nil {
			out = append(out, md)
		}
	}
	Sort(out)
	return out, nil
}

// Sort orders snapshots newest first (by time, then revision).
func Sort(list []Metadata) {
	slices.SortFunc(list, func(a, b Metadata) int {
		if c := b.TakenAt.Compare(a.TakenAt); c != 0 {
			return c
		}
		return cmp.Compare(b.Revision, a.Revision)
	})
}

// Read returns the metadata of the named snapshot. A bad name is
// ErrBadName; a snapshot that is not there (no .json, or no .db beside
// it) is fs.ErrNotExist.
func (d Dir) Read(name string) (Metadata, error) {
	if _, _, err := ParseName(name); err != nil {
		return Metadata{}, err
	}
	b, err := os.ReadFile(d.Meta(name))
	if err != nil {
		return Metadata{}, err
	}
	var md Metadata
	if err := json.Unmarshal(b, &md); err != nil {
		return Metadata{}, fmt.Errorf("%s: %w", d.Meta(name), err)
	}
	if md.Name != name {
		return Metadata{}, fmt.Errorf("%s names snapshot %q", d.Meta(name), md.Name)
	}
	if st, err := os.Stat(d.DB(name)); err != nil {
		return Metadata{}, err
	} else if !st.Mode().IsRegular() {
		return Metadata{}, fmt.Errorf("%s is no regular file: %w", d.DB(name), fs.ErrNotExist)
	}
	return md, nil
}

// WriteMeta writes md as the .json of its snapshot: the last step of
// taking one, which makes its .db a snapshot.
func (d Dir) WriteMeta(md Metadata) error {
	b, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return err
	}
	return WriteFile(d.Meta(md.Name), append(b, '\n'))
}

// Remove deletes a snapshot: its .json first, so that an interruption
// leaves a .db without .json, which is no snapshot.
func (d Dir) Remove(name string) error {
	if _, _, err := ParseName(name); err != nil {
		return err
	}
	if err := os.Remove(d.Meta(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Remove(d.DB(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return SyncDir(string(d))
}

// CreatePart creates a new .part file in the directory for a snapshot
// being written.
func (d Dir) CreatePart() (*os.File, error) {
	return os.CreateTemp(string(d), "incoming-*"+PartExt)
}

// Expired is what the retention deletes from list (newest first): every
// snapshot after the keep newest, and every one older than maxAge at now;
// never the newest.
func Expired(list []Metadata, keep int, maxAge time.Duration, now time.Time) []Metadata {
	var out []Metadata
	for i, md := range list {
		if i == 0 {
			continue
		}
		if i >= keep || now.Sub(md.TakenAt) > maxAge {
			out = append(out, md)
		}
	}
	return out
}

// Leftovers are the files of the directory that belong to no snapshot: a
// .part or a snapshot's .db without its .json last modified more than
// grace before now (older than any write in progress can be), and a
// snapshot's .json without its .db (whose .db was deleted by hand).
// Other files are not ours and are left alone.
func (d Dir) Leftovers(now time.Time, grace time.Duration) ([]string, error) {
	entries, err := os.ReadDir(string(d))
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Name()] = true
	}
	var out []string
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		file := e.Name()
		old := func() bool {
			info, err := e.Info()
			return err == nil && now.Sub(info.ModTime()) > grace
		}
		if strings.HasSuffix(file, PartExt) {
			if old() {
				out = append(out, file)
			}
			continue
		}
		for ext, other := range map[string]string{DBExt: MetaExt, MetaExt: DBExt} {
			name, ok := strings.CutSuffix(file, ext)
			if !ok || !nameRE.MatchString(name) || have[name+other] {
				continue
			}
			if ext == MetaExt || old() {
				out = append(out, file)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// WriteFile writes data to path the way every file of the directory is
// written: to a .part beside it, synced, renamed, and the directory synced.
func WriteFile(path string, data []byte) error {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:]) // never fails (crypto/rand)
	part := path + "." + hex.EncodeToString(rnd[:]) + PartExt
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(part, path)
	}
	if err != nil {
		os.Remove(part)
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes the directory's entries (a rename, a removal) durable.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
