package kubernetes

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// TestOffsiteComponent: components/offsite (overlays/local-offsite) gives
// the curators --snapshot-offsite from the Secret curia-s3, whose keys are
// the variables the curator reads (the endpoint and keys), so that
// snapshots outlive the curators' emptyDir; overlays/local has none of it.
func TestOffsiteComponent(t *testing.T) {
	const arg = "--snapshot-offsite=$(CURIA_SNAPSHOT_OFFSITE)"
	for overlay, want := range map[string]bool{"overlays/local-offsite": true, "overlays/local": false} {
		res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
		if err != nil {
			t.Fatalf("kustomize build %s: %v", overlay, err)
		}
		m, err := decodeAll(res.Resources())
		if err != nil {
			t.Fatal(err)
		}
		d := m.deployments["curia-curator"]
		if d == nil {
			t.Fatalf("%s: no Deployment curia-curator", overlay)
		}
		c := d.Spec.Template.Spec.Containers[0]
		fromSecret := slices.ContainsFunc(c.EnvFrom, func(e corev1.EnvFromSource) bool {
			return e.SecretRef != nil && e.SecretRef.Name == "curia-s3"
		})
		if got := slices.Contains(c.Args, arg) && fromSecret; got != want || c.Name != "curator" {
			t.Errorf("%s: container %s has %s and the Secret curia-s3 in its environment: %v, want %v (args %v, envFrom %v)", overlay, c.Name, arg, got, want, c.Args, c.EnvFrom)
		}
		if !slices.Contains(c.Args, "--snapshot-dir=/snapshots") {
			t.Errorf("%s: the curators lost --snapshot-dir (off-site copies are of its snapshots): %v", overlay, c.Args)
		}
	}
}
