package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/elastic"
)

// statusDir is where this user's agents put their status sockets.
func statusDir() string {
	return filepath.Join(os.TempDir(), "gorun-status-"+strconv.Itoa(os.Getuid()))
}

// serveMetrics serves the agent's Prometheus metrics, in a registry of
// its own, on addr; without addr there are none.
func serveMetrics(addr string, log zerolog.Logger) (*elastic.Metrics, func(), error) {
	if addr == "" {
		return nil, func() {}, nil
	}
	reg := prometheus.NewRegistry()
	m := elastic.NewMetrics(reg)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	log.Info().Str("addr", l.Addr().String()).Msg("serving metrics at /metrics")
	return m, func() { srv.Close() }, nil
}

// statusCommand is `gorun status`: one table of every node and rank of
// the jobs whose agents run on this node, read from their status sockets.
func statusCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show every node and rank of the jobs running on this node: pid, state, restarts, CPU, memory, idle time",
		Description: "Asks the agents on this node (their sockets in the user's status folder) for their job's\n" +
			"status, which every agent publishes to the job's store each second, and prints one row per\n" +
			"worker of every node.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "rdzv-id", Usage: "only the job of this run id"},
			&cli.StringFlag{Name: "rdzv-endpoint", Usage: "read the job of --rdzv-id from its rendezvous store at `HOST:PORT`, from any machine that reaches it"},
			&cli.StringFlag{Name: "rdzv-conf", Usage: "the job's --rdzv-conf: its token_file is the store's secret (else $" + rdzvTokenEnv + ")"},
			&cli.BoolFlag{Name: "json", Usage: "print the nodes' documents as JSON"},
			&cli.BoolFlag{Name: "watch", Usage: "redraw every second until the job ends or Ctrl-C"},
			&cli.BoolFlag{Name: "stacks", Usage: "print every local worker's stacks (Go workers through their runtime, Python through py-spy), stopping none"},
		},
		Action: func(c *cli.Context) error {
			ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer stop()
			read, closeSource, err := statusSourceOf(c, os.LookupEnv)
			if err != nil {
				return err
			}
			defer closeSource()
			if !c.Bool("watch") {
				docs, local, socks, err := read(ctx)
				if err != nil {
					return err
				}
				switch {
				case c.Bool("json"):
					enc := json.NewEncoder(stdout)
					enc.SetIndent("", "  ")
					return enc.Encode(docs)
				case c.Bool("stacks"):
					return printStacks(ctx, stdout, local, socks, exec.LookPath)
				}
				return writeStatusTable(stdout, docs, time.Now())
			}
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				docs, _, _, err := read(ctx)
				if err != nil {
					fmt.Fprintln(stdout, "the job has ended")
					return nil
				}
				fmt.Fprint(stdout, "\033[H\033[2J")
				if err := writeStatusTable(stdout, docs, time.Now()); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
				}
			}
		},
	}
}

var errNoAgent = errors.New("no running gorun agent on this node")

// readStatus asks every agent socket in dir for its job's documents;
// local are the answering agents' own nodes (the last document of each
// reply), whose workers run here, and socks their agents' sockets.
func readStatus(ctx context.Context, dir, runID string) (docs, local []elastic.NodeStatus, socks []string, err error) {
	all := elastic.StatusSockets(dir)
	for _, sock := range all {
		got, err := askAgent(ctx, sock)
		if err != nil || len(got) == 0 || (runID != "" && got[0].RunID != runID) {
			continue
		}
		docs = append(docs, got...)
		local = append(local, got[len(got)-1])
		socks = append(socks, sock)
	}
	docs = latestPerNode(docs)
	if len(docs) == 0 {
		return nil, nil, nil, fmt.Errorf("status: %w (looked in %s)", errNoAgent, dir)
	}
	return docs, local, socks, nil
}

// agentClient talks HTTP to the agent whose socket is sock.
func agentClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

func askAgent(ctx context.Context, sock string) ([]elastic.NodeStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	client := agentClient(sock)
	req, err := http.NewRequestWithContext(ctx, "GET", "http://agent/status", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var docs []elastic.NodeStatus
	if err := json.NewDecoder(resp.Body).Decode(&docs); err != nil {
		return nil, fmt.Errorf("status: %s: %w", sock, err)
	}
	return docs, nil
}

// latestPerNode keeps the newest document of every node of every job
// (two agents of one job on this node both answer for all its nodes),
// ordered by run id and node rank.
func latestPerNode(docs []elastic.NodeStatus) []elastic.NodeStatus {
	type key struct {
		run  string
		node int
	}
	best := map[key]elastic.NodeStatus{}
	for _, d := range docs {
		k := key{d.RunID, d.NodeRank}
		if b, ok := best[k]; !ok || d.Time.After(b.Time) {
			best[k] = d
		}
	}
	out := make([]elastic.NodeStatus, 0, len(best))
	for _, d := range best {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b elastic.NodeStatus) int {
		if c := strings.Compare(a.RunID, b.RunID); c != 0 {
			return c
		}
		return a.NodeRank - b.NodeRank
	})
	return out
}

// writeStatusTable prints one row per worker of every node.
func writeStatusTable(w io.Writer, docs []elastic.NodeStatus, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// Go workers under --hang-timeout say which collective they are in.
	collectives := slices.ContainsFunc(docs, func(d elastic.NodeStatus) bool {
		return slices.ContainsFunc(d.Workers, func(r elastic.WorkerStatus) bool { return r.Collective != "" })
	})
	header := "RUN\tHOST\tNODE\tRANK\tLOCAL\tPID\tSTATE\tRESTARTS\tCPU%\tRSS\tIDLE\tAGE"
	if collectives {
		header += "\tCOLLECTIVE"
	}
	fmt.Fprintln(tw, header)
	for _, d := range docs {
		rows := slices.Clone(d.Workers)
		slices.SortFunc(rows, func(a, b elastic.WorkerStatus) int { return a.Rank - b.Rank })
		for _, r := range rows {
			state := r.State
			if r.Exit != "" {
				state += " (" + r.Exit + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d\t%.0f\t%s\t%.0fs\t%.0fs",
				d.RunID, d.Host, d.NodeRank, r.Rank, r.LocalRank, r.Pid, state, r.Restarts, r.CPU,
				formatBytes(r.RSS), r.Idle, max(0, now.Sub(d.Time).Seconds()))
			if collectives {
				fmt.Fprintf(tw, "\t%s", cmp.Or(r.Collective, "-"))
			}
			fmt.Fprintln(tw)
		}
	}
	return tw.Flush()
}

// formatBytes prints n in binary units, one decimal.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + "B"
	}
	v, suffix := float64(n), "B"
	for _, s := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if v < unit {
			break
		}
		v, suffix = v/unit, s
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + suffix
}

// printStacks prints the stacks of the workers that run on this node,
// stopping none: Python ones through py-spy dump, the others by asking
// their agent (local[i]'s socket is socks[i]), which asks the worker's Go
// runtime.
func printStacks(ctx context.Context, w io.Writer, local []elastic.NodeStatus, socks []string, lookPath func(string) (string, error)) error {
	pyspy, _ := lookPath("py-spy")
	for i, d := range local {
		for _, r := range d.Workers {
			if r.State != elastic.StateRunning {
				continue
			}
			fmt.Fprintf(w, "=== rank %d (local rank %d, pid %d, node %d)\n", r.Rank, r.LocalRank, r.Pid, d.NodeRank)
			exe, err := os.Readlink("/proc/" + strconv.Itoa(r.Pid) + "/exe")
			switch {
			case err != nil:
				fmt.Fprintln(w, "not running on this node")
			case !strings.Contains(filepath.Base(exe), "python"):
				if i >= len(socks) {
					fmt.Fprintln(w, "not a Python worker, and no agent to ask for its stacks")
					continue
				}
				stacks, err := askAgentStacks(ctx, socks[i], r.Rank)
				if err != nil {
					fmt.Fprintln(w, err)
					continue
				}
				io.WriteString(w, stacks)
			case pyspy == "":
				fmt.Fprintln(w, "py-spy is not on PATH: pip install py-spy")
			default:
				cmd := exec.CommandContext(ctx, pyspy, "dump", "--pid", strconv.Itoa(r.Pid))
				cmd.Stdout, cmd.Stderr = w, w
				if err := cmd.Run(); err != nil {
					fmt.Fprintf(w, "py-spy dump: %v\n", err)
				}
			}
		}
	}
	return nil
}

// askAgentStacks asks the agent whose socket is sock for the stacks of
// its worker of rank.
func askAgentStacks(ctx context.Context, sock string, rank int) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://agent/stacks/"+strconv.Itoa(rank), nil)
	if err != nil {
		return "", err
	}
	resp, err := agentClient(sock).Do(req)
	if err != nil {
		return "", fmt.Errorf("status: stacks of rank %d: %w", rank, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("status: stacks of rank %d: %w", rank, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status: stacks of rank %d: %s", rank, strings.TrimSpace(string(b)))
	}
	return string(b), nil
}
