package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version, when set at link time (-ldflags "-X main.version=v1.2.3", as the
// Dockerfile's VERSION build argument does for a tree without .git), names
// the build instead of the module version from the build information.
var version string

// versionLine describes this binary in one line: its version (the module
// version go build derives from the commit, "(devel)" without one), the
// commit, its time and whether the tree had uncommitted changes, and the Go
// toolchain and platform.
func versionLine() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return formatVersion(version, bi, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH)
}

// formatVersion is versionLine from its parts: override (if set) wins over
// the module version of bi, which may be nil (no build information); the
// commit is said to be unknown only when neither names it.
func formatVersion(override string, bi *debug.BuildInfo, goVersion, platform string) string {
	v := override
	if v == "" && bi != nil {
		v = bi.Main.Version
	}
	if v == "" {
		v = "(devel)"
	}
	vcs := map[string]string{}
	if bi != nil {
		for _, s := range bi.Settings {
			vcs[s.Key] = s.Value
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pdserve %s", v)
	if rev := vcs["vcs.revision"]; rev != "" {
		details := []string{rev}
		if t := vcs["vcs.time"]; t != "" {
			details = append(details, t)
		}
		if vcs["vcs.modified"] == "true" {
			details = append(details, "modified")
		}
		fmt.Fprintf(&b, " (commit %s)", strings.Join(details, ", "))
	} else if override == "" {
		b.WriteString(" (commit unknown: built without version control information)")
	}
	fmt.Fprintf(&b, " %s %s", goVersion, platform)
	return b.String()
}

func newVersionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go toolchain of this binary (as --version)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(stdout, versionLine())
			return err
		},
	}
}
