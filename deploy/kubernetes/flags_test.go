package kubernetes

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"curia.dev/platform/proctest"
)

// usageLine is a flag in the usage text of Go's flag package: "  -name"
// for a boolean, "  -name type" for a flag with a value.
var usageLine = regexp.MustCompile(`(?m)^  -(\S+)(?: (\S+))?$`)

// cmdPackages maps each binary of the image (/bin/<name>) to its package:
// `make build`'s CMDS.
func cmdPackages(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CMDS\s*:=(.*)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no CMDS in the Makefile")
	}
	out := map[string]string{}
	for _, dir := range strings.Fields(string(m[1])) {
		out["/bin/"+path.Base(dir)] = "curia.dev/" + dir // every module is curia.dev/<its directory>
	}
	return out
}

// buildBinaries builds the binaries (/bin/<name>) and returns each one's
// path by its name in the image.
func buildBinaries(t *testing.T, bins []string) map[string]string {
	t.Helper()
	pkgs := cmdPackages(t)
	out := map[string]string{}
	for _, b := range bins {
		if pkgs[b] == "" {
			t.Fatalf("%s is no binary of the image", b)
		}
		out[b] = proctest.Build(t, pkgs[b])
	}
	return out
}

// binaryFlags returns the flag set the usage (-h) of the binary exe shows,
// for the subcommand sub if any.
func binaryFlags(t *testing.T, exe string, sub []string) *flag.FlagSet {
	t.Helper()
	out, _ := exec.Command(exe, append(append([]string(nil), sub...), "-h")...).CombinedOutput() // -h exits 0 or 2: the text is what counts
	fs := flag.NewFlagSet(strings.Join(append([]string{exe}, sub...), " "), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, l := range usageLine.FindAllStringSubmatch(string(out), -1) {
		if l[2] == "" {
			fs.Bool(l[1], false, "")
		} else {
			fs.String(l[1], "", "")
		}
	}
	if n := countFlags(fs); n < 2 {
		t.Fatalf("%s %v -h shows %d flags:\n%s", exe, sub, n, out)
	}
	return fs
}

func countFlags(fs *flag.FlagSet) int {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n
}

// TestManifestFlags parses every container's arguments, and every
// probe's command, with the flags the binary it runs has (built
// from this tree, as `make images` would, and asked with -h): a flag a
// binary does not know, or a value missing, fails here instead of in a
// crash loop.
func TestManifestFlags(t *testing.T) {
	// Every command line of both kustomizations: the binary (with
	// curia-kube's subcommand), its arguments, and where it is.
	type cmdline struct {
		cmd, args []string
		where     string
	}
	var lines []cmdline
	bins := map[string]bool{}
	for _, dir := range kustomizations {
		ws, err := render(t, dir).workloads()
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			for _, c := range containers(w.pod) {
				where := dir + ": " + w.String() + "/" + c.Name
				if len(c.Command) == 0 {
					t.Errorf("%s: no command", where)
					continue
				}
				n := min(len(c.Command), 2) // curia-kube takes its subcommand first
				lines = append(lines, cmdline{c.Command[:n], append(slices.Clone(c.Command[n:]), c.Args...), where})
				for _, kp := range probes(c) {
					if p := kp.probe; p.Exec != nil && len(p.Exec.Command) > 0 {
						lines = append(lines, cmdline{p.Exec.Command[:1], p.Exec.Command[1:], where + " " + kp.kind + " probe"})
					}
				}
			}
		}
	}
	for _, l := range lines {
		bins[l.cmd[0]] = true
	}
	bins["/bin/curator"], bins["/bin/roleserve"] = true, true // for the check of the check, below
	exes := buildBinaries(t, slices.Sorted(maps.Keys(bins)))
	sets := map[string]*flag.FlagSet{}
	parse := func(cmd, args []string) error {
		key := strings.Join(cmd, " ")
		if sets[key] == nil {
			sets[key] = binaryFlags(t, exes[cmd[0]], cmd[1:])
		}
		fs := sets[key]
		// The kubelet expands $(POD_NAME) before the binary sees it.
		args = slices.Clone(args)
		for i := range args {
			args[i] = strings.ReplaceAll(args[i], "$(POD_NAME)", "curia-node-0")
		}
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return fmt.Errorf("positional arguments %v", fs.Args())
		}
		return nil
	}
	for _, l := range lines {
		if err := parse(l.cmd, l.args); err != nil {
			t.Errorf("%s: %v: %v", l.where, l.cmd, err)
		}
	}
	// The check itself: a misspelt flag, and a flag without its value.
	if err := parse([]string{"/bin/curator"}, []string{"--listen-htp=0.0.0.0:7201"}); err == nil {
		t.Error("curator --listen-htp was accepted")
	}
	if err := parse([]string{"/bin/roleserve"}, []string{"--address"}); err == nil {
		t.Error("roleserve --address without a value was accepted")
	}
}
