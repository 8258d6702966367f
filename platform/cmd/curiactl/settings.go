package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// Connection settings come, for each, from the first of: its flag, its
// CURIA_* variables (.curia/env, .curia-compose/env), the current context
// of the config file. The file, like a kubeconfig or talosconfig, names
// contexts, one a cluster:
//
//	current-context: prod
//	contexts:
//	- name: prod
//	  curators: [10.0.0.21:7200, 10.0.0.22:7200]
//	  reconcilers: [10.0.0.31:7300]
//	  consensus: [10.0.0.11:7100, 10.0.0.12:7100, 10.0.0.13:7100]
//	  ca: prod/ca.crt            # relative to the file's directory
//	  cert: prod/admin.crt
//	  key: prod/admin.key
//	  cluster: prod.example      # default: the certificate's trust domain

// Where the config file and the context come from when their flags are
// not given.
const (
	envConfig  = "CURIACTL_CONFIG"
	envContext = "CURIACTL_CONTEXT"
)

// configFile is the config file.
type configFile struct {
	CurrentContext string        `json:"current-context,omitempty"`
	Contexts       []contextFile `json:"contexts"`
}

// contextFile is one context: how to reach one cluster.
type contextFile struct {
	Name        string   `json:"name"`
	Curators    []string `json:"curators,omitempty"`
	Reconcilers []string `json:"reconcilers,omitempty"`
	Consensus   []string `json:"consensus,omitempty"`
	CA          string   `json:"ca,omitempty"`
	Cert        string   `json:"cert,omitempty"`
	Key         string   `json:"key,omitempty"`
	Cluster     string   `json:"cluster,omitempty"`
}

// settingDef is one connection setting: its flag and variables, and its
// value in a context.
type settingDef struct {
	flag string
	vars []string
	file func(*contextFile) string
	// path: a file name, which a context gives relative to its file.
	path bool
}

// Setting names.
const (
	setCurators    = "curators"
	setReconcilers = "reconcilers"
	setConsensus   = "consensus"
	setCA          = "ca"
	setCert        = "cert"
	setKey         = "key"
	setCluster     = "cluster"
)

var settingDefs = map[string]settingDef{
	setCurators:    {flag: "--curator", vars: []string{envCurators, envCurator}, file: func(c *contextFile) string { return strings.Join(c.Curators, ",") }},
	setReconcilers: {flag: "--reconciler", vars: []string{envReconcilers, envReconciler}, file: func(c *contextFile) string { return strings.Join(c.Reconcilers, ",") }},
	setConsensus:   {flag: "--consensus", vars: []string{envConsensus}, file: func(c *contextFile) string { return strings.Join(c.Consensus, ",") }},
	setCA:          {flag: "--ca", vars: []string{envCA}, file: func(c *contextFile) string { return c.CA }, path: true},
	setCert:        {flag: "--cert", vars: []string{envCert}, file: func(c *contextFile) string { return c.Cert }, path: true},
	setKey:         {flag: "--key", vars: []string{envKey}, file: func(c *contextFile) string { return c.Key }, path: true},
	setCluster:     {flag: "--cluster", vars: []string{envCluster}, file: func(c *contextFile) string { return c.Cluster }},
}

// settingOrder is the order context show lists them in.
var settingOrder = []string{setCurators, setReconcilers, setConsensus, setCA, setCert, setKey, setCluster}

// setting is the value of the setting name (flag, the flag's value) and
// where it came from ("--ca", "$CURIA_CACERT", "context prod of FILE"),
// or "" if nowhere. Only a config file that does not load, or a context
// not in it, is an error: checked whenever the file or the context is
// named (flag or variable), even if flags and variables give every
// setting, and else only when a setting comes from the default file.
func (a *app) setting(name, flag string) (string, string, error) {
	def := settingDefs[name]
	if a.contextFlag != "" || a.configFlag != "" || a.getenv(envContext) != "" || a.getenv(envConfig) != "" {
		if _, _, err := a.context(); err != nil {
			return "", "", err
		}
	}
	if flag != "" {
		return flag, def.flag, nil
	}
	for _, v := range def.vars {
		if s := a.getenv(v); s != "" {
			return s, "$" + v, nil
		}
	}
	ctx, path, err := a.context()
	if err != nil || ctx == nil {
		return "", "", err
	}
	s := def.file(ctx)
	if s == "" {
		return "", "", nil
	}
	if def.path && !filepath.IsAbs(s) {
		s = filepath.Join(filepath.Dir(path), s)
	}
	return s, fmt.Sprintf("context %s of %s", ctx.Name, path), nil
}

// missing is the error for a setting found nowhere: it names the flag,
// the variables and the config file.
func (a *app) missing(name, what string) error {
	def := settingDefs[name]
	where := "a context of the config file (--config, $" + envConfig + ", default ~/.config/curia/config.yaml)"
	if path, _ := a.configPath(); path != "" {
		where = "the current context of " + path
	}
	return configError{fmt.Errorf("no %s: pass %s or set %s (source .curia/env after make run), or %s in %s", what, def.flag, strings.Join(def.vars, " or "), name, where)}
}

// configPath is the config file's path and whether it was named (by
// --config or $CURIACTL_CONFIG) rather than the default, which may be
// absent.
func (a *app) configPath() (string, bool) {
	if a.configFlag != "" {
		return a.configFlag, true
	}
	if p := a.getenv(envConfig); p != "" {
		return p, true
	}
	if x := a.getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "curia", "config.yaml"), false
	}
	if h := a.getenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "curia", "config.yaml"), false
	}
	return "", false
}

// loadConfig reads the config file, once: nil when the default one does
// not exist.
func (a *app) loadConfig() (*configFile, string, error) {
	if a.cfgLoaded {
		return a.cfgFile, a.cfgPath, a.cfgErr
	}
	a.cfgLoaded = true
	path, named := a.configPath()
	a.cfgPath = path
	if path == "" {
		return nil, "", nil
	}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !named:
		return nil, path, nil
	case err != nil:
		a.cfgErr = configError{fmt.Errorf("config file: %w", err)}
		return nil, path, a.cfgErr
	}
	var f configFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		a.cfgErr = configError{fmt.Errorf("config file %s does not parse: %w (want current-context and contexts: a list of name, curators, reconcilers, consensus, ca, cert, key, cluster)", path, err)}
		return nil, path, a.cfgErr
	}
	for i, c := range f.Contexts {
		if c.Name == "" {
			a.cfgErr = configError{fmt.Errorf("config file %s: context %d has no name", path, i+1)}
			return nil, path, a.cfgErr
		}
		if slices.ContainsFunc(f.Contexts[:i], func(o contextFile) bool { return o.Name == c.Name }) {
			a.cfgErr = configError{fmt.Errorf("config file %s: two contexts are named %s", path, c.Name)}
			return nil, path, a.cfgErr
		}
	}
	a.cfgFile = &f
	return a.cfgFile, path, nil
}

// context is the context in use: --context's, else $CURIACTL_CONTEXT's,
// else the file's current-context (nil for none), and the file's path.
func (a *app) context() (*contextFile, string, error) {
	f, path, err := a.loadConfig()
	if err != nil {
		return nil, path, err
	}
	name, from := a.contextFlag, "--context"
	if name == "" {
		name, from = a.getenv(envContext), "$"+envContext
	}
	if f == nil {
		if name != "" {
			return nil, path, configError{fmt.Errorf("%s %s: no config file (%s)", from, name, orDash(path))}
		}
		return nil, path, nil
	}
	if name == "" {
		name, from = f.CurrentContext, "current-context"
	}
	if name == "" {
		return nil, path, nil
	}
	i := slices.IndexFunc(f.Contexts, func(c contextFile) bool { return c.Name == name })
	if i < 0 {
		var names []string
		for _, c := range f.Contexts {
			names = append(names, c.Name)
		}
		return nil, path, configError{fmt.Errorf("%s %s: no such context in %s (it has: %s)", from, name, path, orDash(strings.Join(names, ", ")))}
	}
	return &f.Contexts[i], path, nil
}
