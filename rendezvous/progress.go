package rendezvous

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// Progress reports: a node that waits for a round says, every
// ProgressPeriod, who is there and who is not, so that a job stuck at
// startup names the node it waits for instead of sitting silent until its
// join timeout. The first report comes after FirstProgress: a round that
// forms at once says nothing.
const (
	ProgressPeriod = 5 * time.Second
	FirstProgress  = 2500 * time.Millisecond
)

// Waiting is what a node waiting for a round knows of it: one progress
// report, or the end of the wait at the join timeout.
type Waiting struct {
	// Joined is how many nodes are there, this one included; Names names
	// them where known (host names, or node ranks), perhaps fewer.
	Joined int
	Names  []string
	// Missing names the expected nodes that are not there, when the
	// rendezvous knows whom to expect (a static job's ranks, the hosts of
	// an SSH or Slurm job); nil otherwise.
	Missing  []string
	Min, Max int
	// Left is how long the wait lasts yet, and Until what ends it: "last
	// call" (the round then starts with the nodes there) or "join
	// timeout".
	Left  time.Duration
	Until string
	// CountedAgo is how old Joined is when the report was not read
	// afresh (a large round's nodes other than the first report what
	// they read last); zero when it was.
	CountedAgo time.Duration
}

// MissingText says who is missing: the expected nodes by name when known,
// else how many more nodes the round needs, or may take.
func (w Waiting) MissingText() string {
	if len(w.Missing) > 0 {
		return strings.Join(w.Missing, ", ")
	}
	need := w.Min - w.Joined
	switch {
	case need > 0 && w.Max > w.Min:
		return fmt.Sprintf("%s (up to %d)", nodes(need), w.Max-w.Joined)
	case need > 0:
		return nodes(need)
	case w.Max > w.Joined:
		return fmt.Sprintf("none (up to %s more may join)", nodes(w.Max-w.Joined))
	}
	return "none"
}

func nodes(n int) string {
	if n == 1 {
		return "1 node"
	}
	return fmt.Sprintf("%d nodes", n)
}

// Log writes the report at INFO.
func (w Waiting) Log(log zerolog.Logger) {
	e := log.Info().Int("joined", w.Joined).Int("min", w.Min).Int("max", w.Max)
	if len(w.Names) > 0 {
		e = e.Str("nodes", strings.Join(w.Names, ", "))
	}
	if w.CountedAgo >= time.Second {
		e = e.Stringer("counted_ago", w.CountedAgo.Round(time.Second))
	}
	e.Str("missing", w.MissingText()).Stringer("left", w.Left.Round(time.Second)).
		Str("until", w.Until).Msg("waiting for nodes")
}

// MissingNames returns the expected names that joined lacks, each as often
// as it is missing: several nodes may share a host name.
func MissingNames(expected, joined []string) []string {
	there := map[string]int{}
	for _, n := range joined {
		there[n]++
	}
	var missing []string
	for _, n := range expected {
		if there[n] > 0 {
			there[n]--
			continue
		}
		missing = append(missing, n)
	}
	return missing
}

// MissingRanks names the node ranks below nnodes that arrived lacks.
func MissingRanks(nnodes int, arrived []int) []string {
	var missing []string
	for r := range nnodes {
		if !slices.Contains(arrived, r) {
			missing = append(missing, "node rank "+fmt.Sprint(r))
		}
	}
	return missing
}

// NextProgress says when the next report of a wait that began at start is
// due, the last one having come at last (zero: none yet).
func NextProgress(start, last time.Time) time.Time {
	if last.IsZero() {
		return start.Add(FirstProgress)
	}
	return last.Add(ProgressPeriod)
}

// MissingNodes names the nodes a round of min to max nodes waits for,
// from the hosts of those there and the ranks they asked for (-1: none),
// expected being the hosts of the job's nodes in rank order when the
// launcher knows them. In a job of a fixed size whose nodes each ask for a
// rank, those are the ranks nobody asked for, by the host expected there
// if known (a rank does not depend on how a host names itself); else the
// expected hosts not there; else nil (unknown).
func MissingNodes(hosts []string, ranks []int, expected []string, minNodes, maxNodes int) []string {
	fixed := minNodes == maxNodes
	for _, r := range ranks {
		fixed = fixed && r >= 0 && r < maxNodes
	}
	switch {
	case fixed && len(expected) == maxNodes:
		var missing []string
		for r, h := range expected {
			if !slices.Contains(ranks, r) {
				missing = append(missing, fmt.Sprintf("%s (node rank %d)", h, r))
			}
		}
		return missing
	case fixed:
		return MissingRanks(maxNodes, ranks)
	case len(expected) > 0:
		return MissingNames(expected, hosts)
	}
	return nil
}

// dialWaiting dials the store at addr within opts.Timeout, as Dial does,
// saying every ProgressPeriod (msg, at INFO) that missing, the node that
// hosts it, is not there yet and how long this node waits for it.
func dialWaiting(ctx context.Context, addr string, opts ClientOptions, log zerolog.Logger, missing, msg string) (*Client, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	start := time.Now()
	deadline := start.Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var reported time.Time
	for {
		until := NextProgress(start, reported)
		if deadline.Before(until) {
			until = deadline
		}
		dctx, cancel := context.WithDeadline(ctx, until)
		c, err := Dial(dctx, addr, opts)
		expired := dctx.Err() != nil
		cancel()
		now := time.Now()
		if err == nil || ctx.Err() != nil || !expired || !now.Before(deadline) {
			return c, err
		}
		log.Info().Str("endpoint", addr).Str("missing", missing).
			Stringer("left", deadline.Sub(now).Round(time.Second)).Msg(msg)
		reported = now
	}
}
