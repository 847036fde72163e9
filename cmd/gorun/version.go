package main

import (
	"runtime/debug"
	"strings"
)

// version names this build for gorun --version: the module version that
// go install recorded ("(devel)" for a build from a checkout), the commit
// when the build knew it, and the Go release, so that a bug report says
// which gorun ran.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	parts := []string{info.Main.Version}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value[:min(len(s.Value), 12)]
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev != "" {
		parts = append(parts, "commit "+rev+dirty)
	}
	return strings.Join(append(parts, info.GoVersion), ", ")
}
