package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

const contextLong = `The config file names contexts, one a cluster, as a kubeconfig or a
talosconfig does: --config FILE, else $CURIACTL_CONFIG, else
~/.config/curia/config.yaml ($XDG_CONFIG_HOME/curia/config.yaml). The
context used is --context NAME, else $CURIACTL_CONTEXT, else the file's
current-context. Each setting comes from its flag, else its CURIA_*
variable (.curia/env), else the context: flags > environment > file.

  current-context: prod
  contexts:
  - name: prod
    curators: [10.0.0.21:7200, 10.0.0.22:7200]
    reconcilers: [10.0.0.31:7300]
    consensus: [10.0.0.11:7100, 10.0.0.12:7100, 10.0.0.13:7100]
    ca: prod/ca.crt        # relative paths: to the file's directory
    cert: prod/admin.crt
    key: prod/admin.key
    cluster: prod.example  # default: the certificate's trust domain

A named file that is missing, a file that does not parse (unknown keys
included) and a context that is not in it are errors (exit 3).`

func (a *app) contextCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "context",
		Short: "Show the config file's contexts and the connection settings in effect",
		Long:  contextLong,
		Example: `  curiactl context list
  curiactl context show
  curiactl --context prod context show -o yaml`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the config file's contexts, the current one marked",
		Long:  contextLong,
		Example: `  curiactl context list
  CURIACTL_CONFIG=./curia.yaml curiactl context list`,
		Args: args(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			f, path, err := a.loadConfig()
			if err != nil {
				return err
			}
			cur, _, err := a.context()
			if err != nil {
				return err
			}
			if f == nil {
				f = &configFile{Contexts: []contextFile{}}
			}
			if a.output != "table" {
				return printValue(a.stdout, a.output, f)
			}
			tw := newTable(a.stdout)
			row(tw, "CURRENT", "NAME", "CURATORS", "FILE")
			for _, c := range f.Contexts {
				mark := ""
				if cur != nil && cur.Name == c.Name {
					mark = "*"
				}
				row(tw, mark, c.Name, orDash(settingDefs[setCurators].file(&c)), path)
			}
			if len(f.Contexts) == 0 {
				row(tw, "", "(none)", "", orDash(path))
			}
			return tw.Flush()
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "show",
		Short: "Show each connection setting in effect and where it comes from (flag, variable, context)",
		Long: `Show each connection setting in effect and where it comes from: its flag,
its CURIA_* variable, or the context of the config file (flags >
environment > file). -o yaml prints them as a context of the config file,
ready to paste into one.`,
		Example: `  curiactl context show
  source .curia/env && curiactl context show -o yaml   # a context for the config file`,
		Args: args(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			flags := map[string]string{setCurators: a.curators, setReconcilers: a.reconcilers, setCA: a.ca, setCert: a.cert, setKey: a.key, setCluster: a.cluster}
			values, sources := map[string]string{}, map[string]string{}
			for _, name := range settingOrder {
				v, src, err := a.setting(name, flags[name])
				if err != nil {
					return err
				}
				values[name], sources[name] = v, src
			}
			if a.output != "table" {
				c := contextFile{Name: "NAME", Curators: splitAddrs(values[setCurators]), Reconcilers: splitAddrs(values[setReconcilers]),
					Consensus: splitAddrs(values[setConsensus]), CA: values[setCA], Cert: values[setCert], Key: values[setKey], Cluster: values[setCluster]}
				if cur, _, _ := a.context(); cur != nil {
					c.Name = cur.Name
				}
				return printValue(a.stdout, a.output, c)
			}
			tw := newTable(a.stdout)
			row(tw, "SETTING", "VALUE", "FROM")
			for _, name := range settingOrder {
				row(tw, name, orDash(values[name]), orDash(sources[name]))
			}
			return tw.Flush()
		},
	})
	return cmd
}

// printValue writes v, a plain Go value, as JSON or YAML.
func printValue(w io.Writer, format string, v any) error {
	var b []byte
	var err error
	if format == "json" {
		if b, err = json.MarshalIndent(v, "", "  "); err == nil {
			b = append(b, '\n')
		}
	} else {
		b, err = yaml.Marshal(v)
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s", b)
	return err
}
