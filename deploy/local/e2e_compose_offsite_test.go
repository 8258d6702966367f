//go:build e2e

package local_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/offsite"
	"curia.dev/platform/proctest"
	"curia.dev/platform/recovery"
)

// checkComposeOffsite (issue 31): the compose cluster's curator leader
// copies a snapshot it takes to the project's object store (the s3
// service), ListSnapshots says it is kept in both places, and the host
// fetches it back by its s3:// URL, as curiactl snapshot restore would,
// with the size and sha256 the curator recorded.
func checkComposeOffsite(t *testing.T, m curatorv1.ManagementClient, hostIP string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	taken, err := m.TakeSnapshot(ctx, &curatorv1.TakeSnapshotRequest{Reason: "e2e: off-site copy"})
	if err != nil {
		t.Fatal(err)
	}
	name := taken.GetSnapshot().GetName()
	var url string
	proctest.Eventually(t, 2*time.Minute, func() error {
		list, err := m.ListSnapshots(ctx, &curatorv1.ListSnapshotsRequest{})
		if err != nil {
			return err
		}
		for _, s := range list.GetSnapshots() {
			if s.GetName() == name {
				if s.GetStorage() != curatorv1.SnapshotStorage_SNAPSHOT_STORAGE_LOCAL_AND_OFFSITE {
					return fmt.Errorf("snapshot %s is kept %v (off-site: %s)", name, s.GetStorage(), list.GetOffsiteError())
				}
				url = s.GetOffsiteUrl()
				return nil
			}
		}
		return fmt.Errorf("snapshot %s not listed", name)
	})
	snap, err := recovery.ResolveSnapshot(ctx, url, recovery.ResolveOptions{Dir: t.TempDir(), S3: offsite.Options{Endpoint: hostIP + ":7090", Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	if snap.SHA256 != taken.GetSnapshot().GetSha256() || snap.Size != taken.GetSnapshot().GetSize() {
		t.Fatalf("fetched %s: %d bytes, sha256 %s; the curator recorded %d bytes, %s", url, snap.Size, snap.SHA256, taken.GetSnapshot().GetSize(), taken.GetSnapshot().GetSha256())
	}
	t.Logf("snapshot %s copied off-site to %s and fetched back from the host (%d bytes, sha256 matches)", name, url, snap.Size)
}
