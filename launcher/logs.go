package launcher

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// Std selects worker streams, as torchrun's --redirects and --tee do.
type Std int

// The values of torchrun's Std.
const (
	StdNone Std = iota // neither stream
	StdOut             // stdout only
	StdErr             // stderr only
	StdAll             // both streams
)

// Stdout reports whether s selects the worker's stdout.
func (s Std) Stdout() bool { return s&StdOut != 0 }

// Stderr reports whether s selects the worker's stderr.
func (s Std) Stderr() bool { return s&StdErr != 0 }

// ParseStd parses torchrun's redirect/tee spec for nproc local ranks: one
// digit "0".."3" applies to every rank; a map "0:1,1:2" names ranks one by
// one, and ranks it leaves out get StdNone. An empty spec means StdNone. The
// result has an entry for every local rank in 0..nproc-1.
func ParseStd(spec string, nproc int) (map[int]Std, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("launcher: bad redirect spec %q: %s", spec, fmt.Sprintf(format, args...))
	}
	spec = strings.TrimSpace(spec)
	byRank := make(map[int]Std, nproc)
	for rank := range nproc {
		byRank[rank] = StdNone
	}
	if spec == "" {
		return byRank, nil
	}
	if !strings.Contains(spec, ":") {
		std, err := parseStream(spec)
		if err != nil {
			return nil, bad("%v", err)
		}
		for rank := range byRank {
			byRank[rank] = std
		}
		return byRank, nil
	}
	seen := make(map[int]bool)
	for item := range strings.SplitSeq(spec, ",") {
		rankText, streamText, ok := strings.Cut(strings.TrimSpace(item), ":")
		if !ok {
			return nil, bad("%q is not local_rank:stream", item)
		}
		rank, err := parseLocalRank(rankText, nproc)
		if err != nil {
			return nil, bad("%v", err)
		}
		if seen[rank] {
			return nil, bad("local rank %d given twice", rank)
		}
		seen[rank] = true
		if byRank[rank], err = parseStream(streamText); err != nil {
			return nil, bad("%v", err)
		}
	}
	return byRank, nil
}

func parseStream(text string) (Std, error) {
	n, err := strconv.Atoi(strings.TrimSpace(text))
	if err != nil {
		return 0, fmt.Errorf("stream %q is not a number", text)
	}
	if n < int(StdNone) || n > int(StdAll) {
		return 0, fmt.Errorf("stream %d not in 0-3", n)
	}
	return Std(n), nil
}

// ParseRankFilter parses --local-ranks-filter, a comma-separated list of the
// local ranks whose output reaches the console ("0,2"). An empty spec selects
// every rank, so callers can always test filter[localRank].
func ParseRankFilter(spec string, nproc int) (map[int]bool, error) {
	shown := make(map[int]bool, nproc)
	if strings.TrimSpace(spec) == "" {
		for rank := range nproc {
			shown[rank] = true
		}
		return shown, nil
	}
	for item := range strings.SplitSeq(spec, ",") {
		rank, err := parseLocalRank(item, nproc)
		if err != nil {
			return nil, fmt.Errorf("launcher: bad local ranks filter %q: %w", spec, err)
		}
		shown[rank] = true
	}
	return shown, nil
}

func parseLocalRank(text string, nproc int) (int, error) {
	rank, err := strconv.Atoi(strings.TrimSpace(text))
	if err != nil {
		return 0, fmt.Errorf("local rank %q is not a number", text)
	}
	if rank < 0 || rank >= nproc {
		return 0, fmt.Errorf("local rank %d not in 0-%d", rank, nproc-1)
	}
	return rank, nil
}

// LogPaths lays out one worker's files as torchrun does:
// <logDir>/<runID>/attempt_<attempt>/<localRank>/{stdout.log,stderr.log,error.json}.
// It only computes paths; the caller creates dir.
func LogPaths(logDir, runID string, attempt, localRank int) (dir, stdout, stderr, errorFile string) {
	dir = filepath.Join(logDir, runID, "attempt_"+strconv.Itoa(attempt), strconv.Itoa(localRank))
	return dir, filepath.Join(dir, "stdout.log"), filepath.Join(dir, "stderr.log"), filepath.Join(dir, "error.json")
}
