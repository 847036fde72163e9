package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/elastic"
)

// openReport opens --report's file before the job runs, so that a path
// that cannot be written fails at once rather than after a night's run.
// It is made 0600 (a job's hosts, pids and errors are the user's) and a
// symlink at its last component is refused rather than followed: the
// folder may be a shared one, where another user could plant one.
func openReport(path string) (*os.File, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--report: %w", err)
	}
	return f, nil
}

// writeReport draws the job's timeline into f, as SVG or as an HTML page
// by its name, and closes it; result and err are how the agent's Run ended.
func writeReport(f *os.File, spec elastic.Spec, tl *elastic.Timeline, result *elastic.Result, err error) error {
	if f == nil {
		return nil
	}
	text, failed := elastic.TimelineResult(result, err)
	info := elastic.TimelineInfo{RunID: spec.RunID, Host: spec.Host, Result: text, Failed: failed, End: time.Now()}
	render := elastic.TimelineHTML
	if strings.EqualFold(filepath.Ext(f.Name()), ".svg") {
		render = elastic.TimelineSVG
	}
	_, werr := f.Write(render(info, tl.Events()))
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("--report: %w", werr)
	}
	return nil
}
