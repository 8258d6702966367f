package kubernetes

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestObservability checks deploy/observability beside the manifests that
// scrape it (components/monitoring): every alert has a severity, a summary
// and a description, and a promtool test in rules_test.yaml (make
// check-alerts runs them); the Grafana dashboard is JSON whose every
// panel has a query; every curia_* series the alerts and the dashboard
// use is one docs/metrics.md describes.
func TestObservability(t *testing.T) {
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	docs := string(read("../../docs/metrics.md"))
	series := regexp.MustCompile(`curia_[a-z_]+`)
	documented := func(where, text string) {
		for _, s := range series.FindAllString(text, -1) {
			// A prefix of a regular expression (curia_(consensus|...)_).
			if strings.HasSuffix(s, "_") {
				continue
			}
			if !strings.Contains(docs, "`"+s) {
				t.Errorf("%s uses %s, which docs/metrics.md does not describe", where, s)
			}
		}
	}

	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert       string
				Expr        string
				For         string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	if err := yaml.UnmarshalStrict(read("../observability/rules.yaml"), &rules); err != nil {
		t.Fatal(err)
	}
	tests := string(read("../observability/rules_test.yaml"))
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" {
				t.Errorf("group %s: a rule that is no alert: %q", g.Name, r.Expr)
				continue
			}
			if !slices.Contains([]string{"critical", "warning"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: no summary or description", r.Alert)
			}
			if !strings.Contains(tests, "alertname: "+r.Alert+"\n") {
				t.Errorf("%s: no test in rules_test.yaml", r.Alert)
			}
			if !strings.Contains(docs, "`"+r.Alert+"`") {
				t.Errorf("%s: not in docs/metrics.md", r.Alert)
			}
			documented(r.Alert, r.Expr)
		}
	}
	if n == 0 {
		t.Fatal("no rules in rules.yaml")
	}

	var dash struct {
		Panels []struct {
			Type, Title string
			Targets     []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(read("../observability/grafana-dashboard.json"), &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			documented("dashboard panel "+p.Title, q.Expr)
		}
	}
}
