package kubernetes

import (
	"errors"
	"strings"
	"testing"
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
