package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/gorun/gorun/cuda"
)

// Libraries finds the files that may provide a library and says what
// each holds, as cuda.Search does.
type Libraries interface {
	// Candidates lists the files in the order the search meets them.
	Candidates(ctx context.Context, lib cuda.Library) ([]cuda.Candidate, error)
	// Probe reads the file's version (zero when it cannot) and says why
	// the search would not take it (nil when it would).
	Probe(lib cuda.Library, path string) (cuda.Version, error)
}

// runtimeLibrary is a library the NCCL backend loads, and how the report
// speaks of it.
type runtimeLibrary struct {
	lib     cuda.Library
	title   string
	version func(cuda.Version) string
	install string // how to get it, for when none is found
}

var runtimeLibraries = []runtimeLibrary{
	{
		lib: cuda.NCCLLibrary, title: "NCCL", version: cuda.Version.String,
		install: "install NCCL (package libnccl2, or pip's nvidia-nccl-cu12)",
	},
	{
		lib: cuda.DriverLibrary, title: "CUDA driver", version: majorMinor,
		install: "it comes with the NVIDIA driver",
	},
}

// majorMinor writes a CUDA version as CUDA does: 12.4.
func majorMinor(v cuda.Version) string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// writeLibraries reports, for NCCL and the CUDA driver, every file found
// in the order the search meets them, with its version or why it cannot
// be loaded, and the one the NCCL backend would load.
func writeLibraries(ctx context.Context, r *report, libs Libraries, python string, lookupEnv func(string) (string, bool), environ []string) {
	r.section("NCCL and CUDA libraries")
	for _, l := range runtimeLibraries {
		r.line("%s (%s):", l.title, l.lib)
		found, listErr := libs.Candidates(ctx, l.lib)
		t := r.table()
		var chosen *cuda.Candidate
		var refused []string // files the search tries first, and why it does not take them
		for i, c := range found {
			version, err := libs.Probe(l.lib, c.Path)
			fmt.Fprintf(t, "  %s\t%s\t%s\n", c.From, c.Path, l.status(version, err))
			if !c.Tried || chosen != nil {
				continue
			}
			if err == nil {
				chosen = &found[i]
			} else if version != (cuda.Version{}) {
				refused = append(refused, fmt.Sprintf("%s: %v", c.Path, err))
			}
		}
		t.Flush()
		envVar := l.lib.EnvVar()
		switch {
		case chosen != nil:
			r.line("  the NCCL backend would load %s (%s)", chosen.Path, chosen.From)
		case len(found) == 0:
			r.line("  none found: %s, or name the file in %s", l.install, envVar)
		default:
			why := ""
			if path, ok := lookupEnv(envVar); ok && path != "" {
				why = fmt.Sprintf(" (%s is set: no other file is tried)", envVar)
			}
			r.line("  the NCCL backend would load none of them%s", why)
		}
		for _, reason := range refused {
			r.line("    passing over %s", reason)
		}
		r.line("  searched $%s, LD_LIBRARY_PATH, the ldconfig cache, %s's site-packages/{%s}", envVar, python, strings.Join(l.lib.WheelDirs(), ","))
		if listErr != nil {
			for line := range strings.Lines(listErr.Error()) {
				r.line("  not searched: %s", strings.TrimSpace(line))
			}
		}
	}
	var set []string
	for _, kv := range environ {
		if strings.HasPrefix(kv, "NCCL_") || strings.HasPrefix(kv, "GORUN_NCCL_") || strings.HasPrefix(kv, "GORUN_CUDA_") {
			set = append(set, kv)
		}
	}
	slices.Sort(set)
	if len(set) == 0 {
		r.line("NCCL environment: none set")
	} else {
		r.line("NCCL environment: %s", strings.Join(set, " "))
	}
}

// status is what the report says of a file: the library's version when
// it could be read, else why not.
func (l runtimeLibrary) status(version cuda.Version, err error) string {
	var symbols *cuda.SymbolsError
	switch {
	case version != (cuda.Version{}):
		return l.title + " " + l.version(version)
	case errors.Is(err, fs.ErrNotExist):
		return "not found"
	case errors.As(err, &symbols):
		return fmt.Sprintf("not %s: no %s", l.title, strings.Join(symbols.Missing, ", "))
	}
	return fmt.Sprintf("cannot load: %v", err)
}
