package kubernetes

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// The kustomizations an operator applies: the base (into the default
// namespace) and the local overlay (namespace curia).
var kustomizations = []string{"base", "overlays/local"}

// TestManifests renders each kustomization as kubectl apply -k would,
// decodes every object strictly with the k8s.io/api types and checks the
// invariants of checks_test.go. There is no Kubernetes cluster here: this
// is what stands between a manifest and a broken cluster.
func TestManifests(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			m := render(t, dir)
			for _, c := range checks {
				t.Run(c.name, func(t *testing.T) {
					for _, err := range c.fn(m) {
						t.Error(err)
					}
				})
			}
		})
	}
}

// TestOverlayNamespace: the local overlay puts everything in the
// namespace curia, which it creates.
func TestOverlayNamespace(t *testing.T) {
	m := render(t, "overlays/local")
	if m.namespace != "curia" || m.namespaces["curia"] == nil {
		t.Fatalf("objects in namespace %q, namespaces %v: want all in curia, created by the overlay", m.namespace, m.namespaces)
	}
}

func errorsText(errs []error) string { return errors.Join(errs...).Error() }

// contains reports whether one of errs says want.
func contains(errs []error, want string) bool {
	for _, err := range errs {
		if strings.Contains(err.Error(), want) {
			return true
		}
	}
	return false
}

// jobsAcross says which Jobs `kubectl apply` of b over a (the same
// manifests with another image) would fail on: a Job's pod template is
// immutable, so a Job of both with different templates must be gone by
// then (ttlSecondsAfterFinished, within maxBootstrapTTL) or be named
// differently in b.
func jobsAcross(a, b *manifests) []error {
	var errs []error
	for name, ja := range a.jobs {
		jb := b.jobs[name]
		if jb == nil || equality.Semantic.DeepEqual(ja.Spec.Template, jb.Spec.Template) {
			continue
		}
		if ttl := ja.Spec.TTLSecondsAfterFinished; ttl == nil || *ttl > maxBootstrapTTL {
			errs = append(errs, fmt.Errorf("Job/%s: its pod template changes with the image, and the finished Job stays (ttlSecondsAfterFinished %v): apply would fail on an immutable field", name, ptrOr(ttl, -1)))
		}
	}
	return errs
}

// TestBootstrapJobAcrossImages renders the local overlay with two image
// tags, as an upgrade's `kubectl apply -k` would, and checks that the
// second apply could not fail on the first's Job.
func TestBootstrapJobAcrossImages(t *testing.T) {
	fs := filesys.MakeFsInMemory()
	for _, dir := range []string{"base", "overlays/local"} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if err := fs.WriteFile(filepath.Join("/", dir, e.Name()), b); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := fs.WriteFile("/overlays/next/kustomization.yaml", []byte(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [../local]
images: [{name: curia, newTag: next}]
`)); err != nil {
		t.Fatal(err)
	}
	renderFS := func(dir string) *manifests {
		res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, dir)
		if err != nil {
			t.Fatalf("kustomize build %s: %v", dir, err)
		}
		m, err := decodeAll(res.Resources())
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		return m
	}
	now, next := renderFS("/overlays/local"), renderFS("/overlays/next")
	j := next.jobs["curia-bootstrap"]
	if j == nil || j.Spec.Template.Spec.Containers[0].Image != "curia:next" {
		t.Fatalf("the second rendering's Job %v does not run curia:next: the test would prove nothing", j)
	}
	if errs := jobsAcross(now, next); len(errs) > 0 {
		t.Fatal(errorsText(errs))
	}
	// And it fails where it should: the Job kept after it finished.
	now.jobs["curia-bootstrap"].Spec.TTLSecondsAfterFinished = nil
	if errs := jobsAcross(now, next); !contains(errs, "apply would fail on an immutable field") {
		t.Fatalf("jobsAcross with a Job that stays: %v, want it to fail", errs)
	}
}
