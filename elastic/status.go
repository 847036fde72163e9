package elastic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
)

// Worker states in a status report.
const (
	StateRunning    = "running"
	StateExited     = "exited"
	StateRestarting = "restarting"
)

// statusInterval is how often an agent publishes its node's status.
const statusInterval = time.Second

// statusKey is the round store's key of a node's status document.
func statusKey(nodeRank int) string { return "gorun/status/" + strconv.Itoa(nodeRank) }

// NodeStatus is one node's status document, as an agent publishes it.
type NodeStatus struct {
	RunID    string         `json:"run_id"`
	Host     string         `json:"host"`
	NodeRank int            `json:"node_rank"`
	Nodes    int            `json:"nodes"`
	Round    int            `json:"round"`
	Restarts int            `json:"restarts"`
	Time     time.Time      `json:"time"`
	Workers  []WorkerStatus `json:"workers"`
}

// WorkerStatus is one worker's row.
type WorkerStatus struct {
	Rank      int     `json:"rank"`
	LocalRank int     `json:"local_rank"`
	Pid       int     `json:"pid"`
	State     string  `json:"state"`
	Exit      string  `json:"exit,omitempty"` // "exitcode 3", "signal 9 (SIGKILL)"
	Restarts  int     `json:"restarts"`
	CPU       float64 `json:"cpu_percent"`
	RSS       int64   `json:"rss_bytes"`
	// Idle is the seconds since the worker's last output, or since it
	// started when it wrote none.
	Idle float64 `json:"idle_seconds"`
	// Collective is, for a Go runtime worker under --hang-timeout (its
	// flight recorder), the operation it is in or last completed:
	// "in all_reduce #6 (float32 x 1048576) for 2.1s".
	Collective string `json:"collective,omitempty"`
}

// collectiveOf tells where a rank stands from its flight record at now:
// in its last operation, or past it; "" when nothing was recorded.
func collectiveOf(ops []flightOp, now time.Time) string {
	if len(ops) == 0 {
		return ""
	}
	last := ops[len(ops)-1]
	if last.state == flightRunning {
		return "in " + last.describe() + " for " + roundIdle(now.Sub(last.start)).String()
	}
	return "done " + last.describe()
}

// procSample is what /proc says of a process at one moment.
type procSample struct {
	cpuTicks int64 // utime + stime
	rssPages int64
	at       time.Time
}

// clockTicks is USER_HZ, 100 on every Linux architecture gorun runs on.
const clockTicks = 100

// parseProcStat reads utime+stime from /proc/<pid>/stat. The command
// name, in parentheses, may hold spaces and parentheses: fields are
// counted from the last ')'.
func parseProcStat(b []byte) (int64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("elastic: /proc stat without a command name")
	}
	f := bytes.Fields(b[i+1:])
	// After the name: state(3) ... utime(14) stime(15).
	if len(f) < 13 {
		return 0, errors.New("elastic: /proc stat too short")
	}
	u, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	s, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("elastic: /proc stat: %w", err)
	}
	return u + s, nil
}

// parseProcStatm reads the resident pages from /proc/<pid>/statm.
func parseProcStatm(b []byte) (int64, error) {
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, errors.New("elastic: /proc statm too short")
	}
	n, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("elastic: /proc statm: %w", err)
	}
	return n, nil
}

// sampleProc reads pid's CPU time and resident pages; ok is false when
// the process is gone.
func sampleProc(pid int, now time.Time) (procSample, bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	st, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return procSample{}, false
	}
	sm, err := os.ReadFile(dir + "/statm")
	if err != nil {
		return procSample{}, false
	}
	ticks, err1 := parseProcStat(st)
	pages, err2 := parseProcStatm(sm)
	if err1 != nil || err2 != nil {
		return procSample{}, false
	}
	return procSample{cpuTicks: ticks, rssPages: pages, at: now}, true
}

// slotState is what the agent knows of one worker of the current attempt.
type slotState struct {
	rank, localRank, pid int
	started              time.Time
	lastOutput           *atomic.Int64 // unix nanoseconds, 0 = none
	exit                 *launcher.Exit
	stacks               string // the worker's stacks socket; "": none
	progress             string // its progress file (--hang-timeout); "": none
}

// workerRows computes the published rows: state from the exits, CPU%
// from the difference of two samples, idle time from the last output.
// restarting says the group is stopped between attempts.
// flights holds the live workers' flight records, by pid.
func workerRows(slots []slotState, restarts int, restarting bool, cur, prev map[int]procSample, flights map[int][]flightOp, pageSize int64, now time.Time) []WorkerStatus {
	rows := make([]WorkerStatus, 0, len(slots))
	for _, s := range slots {
		w := WorkerStatus{Rank: s.rank, LocalRank: s.localRank, Pid: s.pid, Restarts: restarts, State: StateRunning,
			Collective: collectiveOf(flights[s.pid], now)}
		last := s.started
		if s.lastOutput != nil {
			if ns := s.lastOutput.Load(); ns != 0 {
				last = time.Unix(0, ns)
			}
		}
		w.Idle = max(0, now.Sub(last).Seconds())
		switch {
		case s.exit != nil:
			w.State, w.Exit = StateExited, s.exit.String()
			if restarting {
				w.State = StateRestarting
			}
		default:
			if c, ok := cur[s.pid]; ok {
				w.RSS = c.rssPages * pageSize
				if p, ok := prev[s.pid]; ok && c.at.After(p.at) {
					w.CPU = float64(c.cpuTicks-p.cpuTicks) / clockTicks / c.at.Sub(p.at).Seconds() * 100
				}
			}
		}
		rows = append(rows, w)
	}
	return rows
}

// statusBoard is the agent's live view of its workers. The agent's
// goroutine updates it through small hooks (begin, started, exited,
// stopped); one goroutine (run) owns sampling and publishing.
type statusBoard struct {
	spec    *Spec
	log     zerolog.Logger
	now     func() time.Time
	metrics *Metrics

	mu         sync.Mutex
	store      rendezvous.Store
	nodeRank   int
	nodes      int
	round      int
	restarts   int
	restarting bool
	slots      []slotState
	last       []byte // this node's last document
	wake       chan struct{}
	// stacksDir is the status folder once its socket listens, where the
	// workers' stacks sockets go; "": none. Set before the first attempt.
	stacksDir string
}

func newStatusBoard(spec *Spec, log zerolog.Logger, now func() time.Time, m *Metrics) *statusBoard {
	return &statusBoard{spec: spec, log: log, now: now, metrics: m, nodeRank: -1, wake: make(chan struct{}, 1)}
}

// begin records a new round.
func (b *statusBoard) begin(r *round) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.restarts > b.restarts {
		b.metrics.restarted(r.restarts - b.restarts)
	}
	b.store, b.nodeRank, b.nodes, b.round, b.restarts = r.store, r.ranks.GroupRank, r.ranks.GroupWorldSize, r.number, r.restarts
}

// started records a new attempt's workers; stamps are their last-output
// clocks, by slot.
func (b *statusBoard) started(att *attempt, stamps []*atomic.Int64) {
	now := b.now()
	pids := att.group.Pids()
	b.mu.Lock()
	b.restarting = false
	b.slots = make([]slotState, len(pids))
	for slot, pid := range pids {
		b.slots[slot] = slotState{rank: att.baseRank + slot, localRank: att.firstLocalRank + slot, pid: pid, started: now, lastOutput: stamps[slot], stacks: att.stacks[slot]}
		if slot < len(att.progress) {
			b.slots[slot].progress = att.progress[slot].path
		}
	}
	b.mu.Unlock()
	b.poke()
}

// exited records a worker's exit.
func (b *statusBoard) exited(e launcher.Exit) {
	b.mu.Lock()
	if e.LocalRank < len(b.slots) {
		b.slots[e.LocalRank].exit = &e
	}
	b.mu.Unlock()
	b.metrics.exited(e)
	b.poke()
}

// stopped records that the group ended; restarting says another attempt follows.
func (b *statusBoard) stopped(restarting bool) {
	b.mu.Lock()
	b.restarting = restarting
	b.mu.Unlock()
	b.poke()
}

func (b *statusBoard) poke() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// run samples and publishes every statusInterval, or when poked, until
// ctx ends.
func (b *statusBoard) run(ctx context.Context) {
	prev := map[int]procSample{}
	t := time.NewTicker(statusInterval)
	defer t.Stop()
	pageSize := int64(os.Getpagesize())
	for {
		b.mu.Lock()
		slots := append([]slotState(nil), b.slots...)
		doc := NodeStatus{RunID: b.spec.RunID, Host: b.spec.Host, NodeRank: b.nodeRank, Nodes: b.nodes, Round: b.round, Restarts: b.restarts}
		restarting, store := b.restarting, b.store
		b.mu.Unlock()
		now := b.now()
		cur := make(map[int]procSample, len(slots))
		flights := map[int][]flightOp{}
		for _, s := range slots {
			if s.exit == nil {
				if p, ok := sampleProc(s.pid, now); ok {
					cur[s.pid] = p
				}
				if s.progress != "" {
					// 5 KiB, in the page cache: the runtime writes it in place.
					if b, err := os.ReadFile(s.progress); err == nil {
						flights[s.pid] = decodeFlight(b)
					}
				}
			}
		}
		doc.Time = now
		doc.Workers = workerRows(slots, doc.Restarts, restarting, cur, prev, flights, pageSize, now)
		prev = cur
		b.metrics.observe(doc)
		if v, err := json.Marshal(doc); err == nil {
			b.mu.Lock()
			b.last = v
			b.mu.Unlock()
			if store != nil && doc.NodeRank >= 0 {
				sctx, cancel := context.WithTimeout(ctx, statusInterval)
				if err := store.Set(sctx, statusKey(doc.NodeRank), v); err != nil && ctx.Err() == nil {
					b.log.Debug().Err(err).Msg("publishing this node's status")
				}
				cancel()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-b.wake:
		}
	}
}

// job reads every node's document from the round's store; this node's
// own comes from memory, so that it is there before the store has it.
func (b *statusBoard) job(ctx context.Context) []json.RawMessage {
	b.mu.Lock()
	store, self, nodes, last := b.store, b.nodeRank, b.nodes, b.last
	b.mu.Unlock()
	var docs []json.RawMessage
	for n := range nodes {
		if n == self || store == nil {
			continue
		}
		key := statusKey(n)
		if ok, err := store.Check(ctx, []string{key}); err != nil || !ok {
			continue
		}
		if v, err := store.Get(ctx, key); err == nil && json.Valid(v) {
			docs = append(docs, v)
		}
	}
	if last != nil {
		docs = append(docs, last)
	}
	return docs
}

// serve answers GET /status on l with the job's documents, a JSON array,
// until ctx ends.
func (b *statusBoard) serve(ctx context.Context, l net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		rctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		docs := b.job(rctx)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(docs)
	})
	mux.HandleFunc("GET /stacks/{rank}", b.serveStacks)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	srv.Serve(l)
}

const statusSocketName = "status.sock"

// StatusSocket is the name of an agent's status socket in the status
// folder: in a folder of the agent's own, named by its pid, which also
// holds its workers' stacks sockets and which its keeper removes if the
// agent is killed.
func StatusSocket(dir string, pid int) string {
	return filepath.Join(dir, strconv.Itoa(pid), statusSocketName)
}

// StatusSockets lists the status sockets of the agents in dir.
func StatusSockets(dir string) []string {
	socks, _ := filepath.Glob(filepath.Join(dir, "*", statusSocketName))
	return socks
}

// listenStatus opens the agent's socket below dir (made 0700 if
// missing), and returns the agent's own folder there.
func listenStatus(dir string) (l net.Listener, own string, closeSocket func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", nil, fmt.Errorf("elastic: status folder: %w", err)
	}
	// A folder another user made first must not receive our socket.
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 || !ownedByMe(fi) {
		return nil, "", nil, fmt.Errorf("elastic: status folder %s is not a private folder of this user", dir)
	}
	path := StatusSocket(dir, os.Getpid())
	own = filepath.Dir(path)
	os.RemoveAll(own) // left by an agent of this pid that died
	if err := os.Mkdir(own, 0o700); err != nil {
		return nil, "", nil, fmt.Errorf("elastic: status folder: %w", err)
	}
	if l, err = net.Listen("unix", path); err != nil {
		os.RemoveAll(own)
		return nil, "", nil, fmt.Errorf("elastic: status socket: %w", err)
	}
	return l, own, func() { l.Close(); os.RemoveAll(own) }, nil
}

func ownedByMe(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid()
}

// stamp wraps w so that every write records the time in last.
func stamp(w io.Writer, last *atomic.Int64, now func() time.Time) io.Writer {
	return stampWriter{w, last, now}
}

type stampWriter struct {
	w    io.Writer
	last *atomic.Int64
	now  func() time.Time
}

func (s stampWriter) Write(p []byte) (int, error) {
	s.last.Store(s.now().UnixNano())
	return s.w.Write(p)
}

// startStatus starts publishing the workers' status and serving it on
// the status socket, when Options ask for either.
func (a *Agent) startStatus(ctx context.Context) (stop func()) {
	if a.opts.StatusDir == "" && a.opts.Metrics == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if a.opts.StatusDir != "" {
		// The job runs without gorun status rather than not at all (a
		// socket path over 107 bytes, a folder of someone else's).
		if l, own, closeSocket, err := listenStatus(a.opts.StatusDir); err != nil {
			a.log.Warn().Err(err).Msg("gorun status will not see this node")
		} else {
			// Killed, the agent leaves no socket behind: its keeper
			// removes the folder.
			if err := a.opts.Keeper.RemoveOnExit(own); err != nil {
				a.log.Warn().Err(err).Msg("keeper lost")
			}
			a.board.stacksDir = own
			wg.Go(func() {
				defer closeSocket()
				a.board.serve(ctx, l)
			})
		}
	}
	wg.Go(func() { a.board.run(ctx) })
	return func() { cancel(); wg.Wait() }
}
