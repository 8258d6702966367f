package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testConfig = `current-context: one
contexts:
- name: one
  curators: [10.0.0.1:7200, 10.0.0.2:7200]
  reconcilers: [10.0.0.1:7300]
  consensus: [10.0.0.1:7100]
  ca: one/ca.crt
  cert: /abs/admin.crt
  key: one/admin.key
  cluster: one.example
- name: two
  curators: [10.0.2.1:7200]
`

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSettingPrecedence: flags over variables over the config file's
// context; paths in the file relative to it; the context from --context,
// $CURIACTL_CONTEXT, else current-context; the file from --config,
// $CURIACTL_CONFIG, $XDG_CONFIG_HOME, $HOME.
func TestSettingPrecedence(t *testing.T) {
	path := writeConfig(t, testConfig)
	dir := filepath.Dir(path)
	tests := map[string]struct {
		env     map[string]string
		flags   map[string]string // setting name -> flag value
		context string            // --context
		config  string            // --config
		name    string
		want    string
		from    string
	}{
		"the file's current context": {env: map[string]string{envConfig: path}, name: setCurators, want: "10.0.0.1:7200,10.0.0.2:7200", from: "context one of " + path},
		"a relative path":            {env: map[string]string{envConfig: path}, name: setCA, want: filepath.Join(dir, "one/ca.crt"), from: "context one of " + path},
		"an absolute path":           {env: map[string]string{envConfig: path}, name: setCert, want: "/abs/admin.crt"},
		"the variable over the file": {env: map[string]string{envConfig: path, envCurator: "127.0.0.1:1"}, name: setCurators, want: "127.0.0.1:1", from: "$CURIA_CURATOR"},
		"CURIA_CURATORS first":       {env: map[string]string{envCurators: "a:1,b:2", envCurator: "a:1"}, name: setCurators, want: "a:1,b:2", from: "$CURIA_CURATORS"},
		"the flag over both":         {env: map[string]string{envConfig: path, envCurators: "127.0.0.1:1"}, flags: map[string]string{setCurators: "flag:1"}, name: setCurators, want: "flag:1", from: "--curator"},
		"--context":                  {env: map[string]string{envConfig: path}, context: "two", name: setCurators, want: "10.0.2.1:7200", from: "context two of " + path},
		"$CURIACTL_CONTEXT":          {env: map[string]string{envConfig: path, envContext: "two"}, name: setCurators, want: "10.0.2.1:7200"},
		"--context over the env":     {env: map[string]string{envConfig: path, envContext: "two"}, context: "one", name: setCluster, want: "one.example"},
		"not in the context":         {env: map[string]string{envConfig: path}, context: "two", name: setCA, want: ""},
		"--config over the env":      {env: map[string]string{envConfig: "/nonexistent"}, config: path, name: setConsensus, want: "10.0.0.1:7100"},
		"$XDG_CONFIG_HOME":           {env: map[string]string{"XDG_CONFIG_HOME": filepath.Dir(dir)}, name: setCurators, want: ""},
		"no file at the default":     {env: map[string]string{"HOME": t.TempDir()}, name: setCurators, want: ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := &app{getenv: func(k string) string { return tc.env[k] }, contextFlag: tc.context, configFlag: tc.config}
			got, from, err := a.setting(tc.name, tc.flags[tc.name])
			if err != nil || got != tc.want || (tc.from != "" && from != tc.from) {
				t.Fatalf("%s = %q from %q, %v; want %q from %q", tc.name, got, from, err, tc.want, tc.from)
			}
		})
	}

	// The default file, under $HOME.
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".config", "curia"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".config", "curia", "config.yaml"), []byte(testConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &app{getenv: func(k string) string { return map[string]string{"HOME": home}[k] }}
	if got, _, err := a.setting(setCluster, ""); err != nil || got != "one.example" {
		t.Errorf("the default file: %q %v", got, err)
	}
}

// TestBadConfigFile: a named file that is missing, one that does not
// parse, an unknown key, an unknown context: exit 3, saying which.
func TestBadConfigFile(t *testing.T) {
	var errOut bytes.Buffer
	for name, tc := range map[string]struct {
		text    string // "" for no file
		context string
		want    string
	}{
		"missing":       {want: "config file: open "},
		"garbled":       {text: "contexts: [name: x\n", want: "does not parse"},
		"unknown key":   {text: "contexts:\n- name: x\n  curator: [a:1]\n", want: `unknown field "curator"`},
		"no name":       {text: "contexts:\n- curators: [a:1]\n", want: "context 1 has no name"},
		"twice":         {text: "contexts:\n- name: x\n- name: x\n", want: "two contexts are named x"},
		"unknown":       {text: testConfig, context: "three", want: "--context three: no such context in "},
		"unknown, file": {text: "current-context: gone\ncontexts:\n- name: x\n", want: "current-context gone: no such context in "},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			if tc.text != "" {
				path = writeConfig(t, tc.text)
			}
			args := []string{"--config", path, "status"}
			if tc.context != "" {
				args = append([]string{"--context", tc.context}, args...)
			}
			var errOut bytes.Buffer
			code := run(context.Background(), args, func(string) string { return "" }, io.Discard, &errOut)
			if code != exitConfig || !strings.Contains(errOut.String(), tc.want) {
				t.Fatalf("exit %d, want %d and %q:\n%s", code, exitConfig, tc.want, errOut.String())
			}
		})
	}
	// A context named is checked even when flags and variables give
	// every setting.
	errOut.Reset()
	full := map[string]string{envCurators: "127.0.0.1:1", envCA: "ca", envCert: "c", envKey: "k", envConfig: writeConfig(t, testConfig)}
	if code := run(context.Background(), []string{"--context", "nowhere", "status"}, func(k string) string { return full[k] }, io.Discard, &errOut); code != exitConfig || !strings.Contains(errOut.String(), "--context nowhere: no such context") {
		t.Errorf("an unknown context, every setting elsewhere: exit %d\n%s", code, errOut.String())
	}
	// Without a file, a context named is an error too.
	errOut.Reset()
	if code := run(context.Background(), []string{"status"}, func(k string) string { return map[string]string{envContext: "x", "HOME": t.TempDir()}[k] }, io.Discard, &errOut); code != exitConfig || !strings.Contains(errOut.String(), "$CURIACTL_CONTEXT x: no config file") {
		t.Errorf("a context without a file: exit %d\n%s", code, errOut.String())
	}
	// A missing setting names the file's context too.
	errOut.Reset()
	path := writeConfig(t, "current-context: x\ncontexts:\n- name: x\n")
	if code := run(context.Background(), []string{"status"}, func(k string) string { return map[string]string{envConfig: path}[k] }, io.Discard, &errOut); code != exitConfig ||
		!strings.Contains(errOut.String(), "no curator address: pass --curator or set CURIA_CURATORS or CURIA_CURATOR (source .curia/env after make run), or curators in the current context of "+path) {
		t.Errorf("a setting in no source: exit %d\n%s", code, errOut.String())
	}
}

func TestContextCommands(t *testing.T) {
	path := writeConfig(t, testConfig)
	env := map[string]string{envConfig: path, envCurator: "127.0.0.1:9"}
	curiactl := func(args ...string) (string, int) {
		var out, errOut bytes.Buffer
		code := run(context.Background(), args, func(k string) string { return env[k] }, &out, &errOut)
		return out.String() + errOut.String(), code
	}
	out, code := curiactl("context", "list")
	if code != 0 || !strings.Contains(out, "*        one   10.0.0.1:7200,10.0.0.2:7200  "+path) || !strings.Contains(out, "\n         two   10.0.2.1:7200") {
		t.Errorf("context list: exit %d\n%s", code, out)
	}
	out, code = curiactl("context", "show", "--cluster", "flag.example")
	lines := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			lines[f[0]] = strings.Join(f[1:], " ")
		}
	}
	for name, want := range map[string]string{
		setCurators:  "127.0.0.1:9 $CURIA_CURATOR",
		setConsensus: "10.0.0.1:7100 context one of " + path,
		setCluster:   "flag.example --cluster",
	} {
		if code != 0 || lines[name] != want {
			t.Errorf("context show: exit %d, %s is %q, want %q\n%s", code, name, lines[name], want, out)
		}
	}
	out, code = curiactl("--context", "two", "context", "show", "-o", "yaml")
	if code != 0 || !strings.Contains(out, "name: two\n") || !strings.Contains(out, "curators:\n- 127.0.0.1:9\n") {
		t.Errorf("context show -o yaml: exit %d\n%s", code, out)
	}
	out, code = curiactl("context", "list", "-o", "json")
	if code != 0 || !strings.Contains(out, `"current-context": "one"`) {
		t.Errorf("context list -o json: exit %d\n%s", code, out)
	}
}

// TestStatusFormats: status -o json and -o yaml carry the same facts under
// the same names, pendingChange null when none is in flight.
func TestStatusFormats(t *testing.T) {
	s := &clusterStatus{Cluster: "curia", Voters: []string{"node-a"}, Learners: []string{}, FailureTolerance: 0}
	for format, want := range map[string][]string{
		"json": {`"cluster": "curia"`, `"pendingChange": null`, `"voters": [` + "\n" + `    "node-a"`, `"failureTolerance": 0`},
		"yaml": {"cluster: curia\n", "pendingChange: null\n", "voters:\n- node-a\n", "failureTolerance: 0\n"},
	} {
		var b bytes.Buffer
		if err := printValue(&b, format, s); err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("-o %s lacks %q:\n%s", format, w, b.String())
			}
		}
	}
	s.PendingChange = &pendingChange{ID: "c1", Operation: "ADD", Fence: []string{"f@1"}}
	var b bytes.Buffer
	if err := printValue(&b, "json", s); err != nil || !strings.Contains(b.String(), `"operation": "ADD"`) {
		t.Errorf("-o json with a pending change: %v\n%s", err, b.String())
	}
}
