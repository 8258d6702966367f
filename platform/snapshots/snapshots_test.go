package snapshots

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestParseName(t *testing.T) {
	at := time.Date(2026, 9, 3, 10, 15, 0, 0, time.UTC)
	tests := map[string]struct {
		name string
		ok   bool
	}{
		"as Name makes it":     {name: Name(at, 1234), ok: true},
		"literal":              {name: "snapshot-20260903T101500Z-rev1234", ok: true},
		"with extension":       {name: "snapshot-20260903T101500Z-rev1234.db"},
		"with a directory":     {name: "snaps/snapshot-20260903T101500Z-rev1234"},
		"path traversal":       {name: "../../etc/passwd"},
		"traversal in a name":  {name: "snapshot-20260903T101500Z-rev1234/../../x"},
		"revision 0":           {name: "snapshot-20260903T101500Z-rev0"},
		"leading zero":         {name: "snapshot-20260903T101500Z-rev01"},
		"no zone":              {name: "snapshot-20260903T101500-rev1"},
		"impossible month":     {name: "snapshot-20261303T101500Z-rev1"},
		"revision overflows":   {name: "snapshot-20260903T101500Z-rev9999999999999999999"},
		"empty":                {name: ""},
		"trailing newline":     {name: "snapshot-20260903T101500Z-rev1\n"},
		"another file's name":  {name: "incoming-123.part"},
		"upper-case prefix":    {name: "SNAPSHOT-20260903T101500Z-rev1"},
		"local time formatted": {name: Name(at.In(time.FixedZone("x", 3600)), 5), ok: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			when, rev, err := ParseName(tc.name)
			if tc.ok != (err == nil) {
				t.Fatalf("ParseName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
			}
			if err != nil {
				if !errors.Is(err, ErrBadName) {
					t.Fatalf("%v is not ErrBadName", err)
				}
				return
			}
			if Name(when, rev) != tc.name {
				t.Fatalf("Name(ParseName(%q)) = %q", tc.name, Name(when, rev))
			}
		})
	}
}

func TestExpired(t *testing.T) {
	now := time.Date(2026, 9, 3, 12, 0, 0, 0, time.UTC)
	// ages in hours, newest first
	list := func(ages ...int) []Metadata {
		var out []Metadata
		for i, h := range ages {
			taken := now.Add(-time.Duration(h) * time.Hour)
			out = append(out, Metadata{Name: Name(taken, int64(100-i)), TakenAt: taken})
		}
		return out
	}
	tests := map[string]struct {
		list   []Metadata
		keep   int
		maxAge time.Duration
		want   []int // indices deleted
	}{
		"nothing":                        {list: nil, keep: 3, maxAge: 24 * time.Hour},
		"within both":                    {list: list(0, 1, 2), keep: 3, maxAge: 24 * time.Hour},
		"by count":                       {list: list(0, 1, 2, 3, 4), keep: 3, maxAge: 24 * time.Hour, want: []int{3, 4}},
		"by age":                         {list: list(0, 1, 30, 40), keep: 10, maxAge: 24 * time.Hour, want: []int{2, 3}},
		"by both":                        {list: list(0, 30, 2, 3), keep: 3, maxAge: 24 * time.Hour, want: []int{1, 3}},
		"keep 1":                         {list: list(0, 1, 2), keep: 1, maxAge: 24 * time.Hour, want: []int{1, 2}},
		"the newest stays however old":   {list: list(50, 60), keep: 3, maxAge: 24 * time.Hour, want: []int{1}},
		"the newest stays even with 0":   {list: list(0, 1), keep: 0, maxAge: 24 * time.Hour, want: []int{1}},
		"exactly max age is kept":        {list: list(0, 24), keep: 3, maxAge: 24 * time.Hour},
		"a lone old snapshot stays":      {list: list(1000), keep: 1, maxAge: time.Hour},
		"age counts from taken, not idx": {list: list(0, 0, 0, 0), keep: 2, maxAge: time.Hour, want: []int{2, 3}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got []int
			for _, md := range Expired(tc.list, tc.keep, tc.maxAge, now) {
				got = append(got, slices.IndexFunc(tc.list, func(x Metadata) bool { return x.Name == md.Name }))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("deleted %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDirectory: List shows only complete snapshots, newest first;
// Leftovers finds the rest; Remove takes the .json first.
func TestDirectory(t *testing.T) {
	d := Dir(t.TempDir())
	now := time.Now()
	old := now.Add(-time.Hour)
	write := func(file string, mod time.Time) {
		t.Helper()
		p := filepath.Join(string(d), file)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	snap := func(taken time.Time, rev int64) string {
		t.Helper()
		md := Metadata{Name: Name(taken, rev), TakenAt: taken.UTC().Truncate(time.Second), Revision: rev}
		write(md.Name+DBExt, taken)
		if err := d.WriteMeta(md); err != nil {
			t.Fatal(err)
		}
		return md.Name
	}
	older := snap(now.Add(-2*time.Hour), 10)
	newer := snap(now.Add(-time.Minute), 20)
	// Not snapshots:
	lonelyOld := Name(old, 5) + DBExt // an interrupted write, long ago
	write(lonelyOld, old)
	lonelyNew := Name(now, 30) + DBExt // being written right now
	write(lonelyNew, now)
	orphanMeta := snap(now.Add(-3*time.Hour), 7) // its .db deleted by hand
	if err := os.Remove(d.DB(orphanMeta)); err != nil {
		t.Fatal(err)
	}
	write("incoming-1"+PartExt, old)
	write("incoming-2"+PartExt, now)
	write("notes.txt", old) // not ours
	write(Name(old, 6)+".json.abc"+PartExt, old)
	if err := os.WriteFile(d.Meta(Name(old, 9)), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	write(Name(old, 9)+DBExt, old)
	if err := os.WriteFile(d.Meta(Name(old, 8)), []byte(`{"name": "`+Name(old, 4)+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	write(Name(old, 8)+DBExt, old)

	list, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, md := range list {
		names = append(names, md.Name)
	}
	if want := []string{newer, older}; !slices.Equal(names, want) {
		t.Fatalf("List = %v, want %v", names, want)
	}

	left, err := d.Leftovers(now, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"incoming-1" + PartExt, lonelyOld, orphanMeta + MetaExt, Name(old, 6) + ".json.abc" + PartExt}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("Leftovers = %v, want %v", left, want)
	}

	if _, err := d.Read("../" + newer); !errors.Is(err, ErrBadName) {
		t.Fatalf("Read of a path: %v, want ErrBadName", err)
	}
	if _, err := d.Read(Name(now, 999)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Read of a missing snapshot: %v, want fs.ErrNotExist", err)
	}
	if err := d.Remove(older); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{d.DB(older), d.Meta(older)} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s after Remove: %v", p, err)
		}
	}
}
