// Command storesim simulates the ranks of a job starting against a
// TCPStore server, gorun's or torch's, one TCP connection per rank, and
// times them, for bench/scale_store.py:
//
//	storesim -addr 127.0.0.1:41234 -ranks 16000 -dialect 2 -server-pid 4242
//
// Every rank runs torch's init pattern: connect; the client's hello for
// its dialect (torch >= 2.5: VALIDATE, then a PING echoed; torch 1.13:
// none); ADD "init/" 1; rank 0 SETs its address; a barrier, ADD then WAIT
// for the key the last rank to arrive sets (torch's store-based barrier);
// then WAIT and GET rank 0's address. It prints one JSON line: seconds to
// all ranks connected (hello included) and to the barrier done, the
// errors by kind, and the server's resident memory before the ranks came
// and once they all sit idle.
//
// A process may hold 20,000 files here and elsewhere often 1,024 or 65,536,
// so the ranks are spread over -procs child processes of this program
// (one per 15,000 ranks by default), started before the clock does: the
// parent tells them all to go at once and reads their results. It speaks
// the wire protocol with its own few lines, not with package rendezvous,
// so that it checks gorun's server independently.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

type options struct {
	addr      string
	ranks     int
	dialect   string
	procs     int
	timeout   time.Duration
	serverPID int
	settle    time.Duration
	shard     int // -1: the parent
}

func main() {
	var o options
	flag.StringVar(&o.addr, "addr", "", "the store's address, host:port")
	flag.IntVar(&o.ranks, "ranks", 1000, "simulated ranks, one connection each")
	flag.StringVar(&o.dialect, "dialect", "2", "torch's wire dialect: 2 (torch >= 2.5: VALIDATE and PING) or 1.13")
	flag.IntVar(&o.procs, "procs", 0, "processes to spread the ranks over (0: one per 15,000 ranks)")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "give up on ranks not done by then")
	flag.IntVar(&o.serverPID, "server-pid", 0, "the server's process id, to read its resident memory (0: not read)")
	flag.DurationVar(&o.settle, "settle", 500*time.Millisecond, "how long the ranks sit idle before the server's memory is read")
	flag.IntVar(&o.shard, "shard", -1, "internal: run as child number n")
	flag.Parse()
	if o.procs <= 0 {
		o.procs = (o.ranks + 14999) / 15000
	}
	if o.addr == "" || o.ranks < 1 || (o.dialect != "2" && o.dialect != "1.13") {
		fmt.Fprintln(os.Stderr, "storesim: want -addr, -ranks >= 1 and -dialect 2 or 1.13")
		os.Exit(2)
	}
	var err error
	if o.shard >= 0 {
		err = runShard(o)
	} else {
		err = runParent(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "storesim:", err)
		os.Exit(1)
	}
}

// result is what a run reports, and, per shard, what a child tells the
// parent (times as Unix nanoseconds there).
type result struct {
	Ranks      int            `json:"ranks"`
	Dialect    string         `json:"dialect"`
	Procs      int            `json:"procs"`
	Connected  float64        `json:"connected_s"` // all ranks connected, hello done
	Barrier    float64        `json:"barrier_s"`   // all ranks through the barrier and the GET
	Done       int            `json:"done"`        // ranks that finished
	Errors     map[string]int `json:"errors"`      // ranks that failed, by kind
	Retries    int            `json:"connect_retries"`
	Aborted    bool           `json:"aborted,omitempty"` // stopped early: a rank failed, the barrier could not complete
	RSSBefore  int64          `json:"server_rss_kib_before,omitempty"`
	RSSIdle    int64          `json:"server_rss_kib_idle,omitempty"`
	CPU        float64        `json:"server_cpu_s,omitempty"` // the server's CPU time (user and system) from go to the barrier done
	ConnectedN int64          `json:"-"`
	DoneN      int64          `json:"-"`
}

type shardResult struct {
	ConnectedAt int64          `json:"connected_at"` // latest rank connected, Unix ns; 0 if none
	DoneAt      int64          `json:"done_at"`
	Connected   int            `json:"connected"`
	Done        int            `json:"done"`
	Errors      map[string]int `json:"errors"`
	Retries     int            `json:"retries"`
}

// runParent starts the shards, lets them go together, and gathers.
func runParent(o options) error {
	type child struct {
		cmd   *exec.Cmd
		in    io.WriteCloser
		lines *bufio.Scanner
	}
	children := make([]*child, o.procs)
	defer func() {
		for _, c := range children {
			if c != nil {
				c.in.Close()
				_ = c.cmd.Wait()
			}
		}
	}()
	for i := range children {
		cmd := exec.Command(os.Args[0], "-addr", o.addr, "-ranks", strconv.Itoa(o.ranks), "-dialect", o.dialect,
			"-procs", strconv.Itoa(o.procs), "-timeout", o.timeout.String(), "-shard", strconv.Itoa(i))
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start shard %d: %w", i, err)
		}
		children[i] = &child{cmd: cmd, in: in, lines: bufio.NewScanner(out)}
	}
	for i, c := range children {
		if !c.lines.Scan() || c.lines.Text() != "ready" {
			return fmt.Errorf("shard %d did not start: %v", i, c.lines.Err())
		}
	}
	res := result{Ranks: o.ranks, Dialect: o.dialect, Procs: o.procs, Errors: map[string]int{}}
	res.RSSBefore = rssKiB(o.serverPID)
	cpuBefore := cpuSeconds(o.serverPID)

	start := time.Now()
	for _, c := range children {
		fmt.Fprintln(c.in, "go")
	}
	// A shard reports "failed" at its first failed rank: the barrier can
	// then never complete, and every shard is told to stop waiting.
	results := make(chan shardResult, o.procs)
	failed := make(chan struct{}, o.procs)
	for i, c := range children {
		go func() {
			for c.lines.Scan() {
				line := c.lines.Text()
				if line == "failed" {
					failed <- struct{}{}
					continue
				}
				var r shardResult
				if err := json.Unmarshal([]byte(line), &r); err != nil {
					r.Errors = map[string]int{fmt.Sprintf("shard %d: %v", i, err): 1}
				}
				results <- r
				return
			}
			results <- shardResult{Errors: map[string]int{fmt.Sprintf("shard %d died", i): 1}}
		}()
	}
	var latestConnected, latestDone int64
	connected := 0
	for got := 0; got < o.procs; {
		select {
		case <-failed:
			if !res.Aborted {
				res.Aborted = true
				for _, c := range children {
					fmt.Fprintln(c.in, "abort")
				}
			}
		case r := <-results:
			got++
			latestConnected = max(latestConnected, r.ConnectedAt)
			latestDone = max(latestDone, r.DoneAt)
			connected += r.Connected
			res.Done += r.Done
			res.Retries += r.Retries
			for k, n := range r.Errors {
				res.Errors[k] += n
			}
		}
	}
	if o.serverPID > 0 {
		res.CPU = cpuSeconds(o.serverPID) - cpuBefore
	}
	if connected == o.ranks {
		res.Connected = time.Unix(0, latestConnected).Sub(start).Seconds()
	}
	if res.Done == o.ranks {
		res.Barrier = time.Unix(0, latestDone).Sub(start).Seconds()
	}
	if o.serverPID > 0 {
		time.Sleep(o.settle) // let the server's bursts of garbage be collected
		res.RSSIdle = rssKiB(o.serverPID)
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// rssKiB reads a process's resident memory, 0 if it cannot.
func rssKiB(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// cpuSeconds reads a process's CPU time, user and system, 0 if it cannot:
// on a busy machine a steadier figure of a server's cost than wall time.
func cpuSeconds(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command, which is in parentheses and may hold
	// spaces: utime and stime are the 12th and 13th of them, in ticks.
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ, 100 on Linux
}

// runShard runs this child's share of the ranks once the parent says go,
// reports, and holds the connections open until the parent's stdin closes,
// so that the server's memory can be read with every rank idle.
func runShard(o options) error {
	first := o.ranks * o.shard / o.procs
	last := o.ranks * (o.shard + 1) / o.procs
	codes := codes113
	if o.dialect == "2" {
		codes = codesV2
	}
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	if !in.Scan() || in.Text() != "go" {
		return errors.New("no go from the parent")
	}
	deadline := time.Now().Add(o.timeout)
	host, _, _ := net.SplitHostPort(o.addr)
	loopback := net.ParseIP(host).IsLoopback()

	var mu sync.Mutex
	sr := shardResult{Errors: map[string]int{}}
	conns := make([]net.Conn, 0, last-first)
	var reportFail sync.Once
	var wg sync.WaitGroup
	for rank := first; rank < last; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rankRun{rank: rank, world: o.ranks, codes: codes, deadline: deadline, register: func(c net.Conn) {
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}}
			if loopback {
				r.local = sourceAddr(rank)
			}
			err := r.run(o.addr)
			now := time.Now().UnixNano()
			mu.Lock()
			defer mu.Unlock()
			sr.Retries += r.retries
			if r.connectedAt > 0 {
				sr.Connected++
				sr.ConnectedAt = max(sr.ConnectedAt, r.connectedAt)
			}
			if err != nil {
				sr.Errors[errorKind(err)]++
				reportFail.Do(func() { fmt.Println("failed") })
				return
			}
			sr.Done++
			sr.DoneAt = max(sr.DoneAt, now)
		}()
	}
	aborted := make(chan struct{})
	go func() {
		for in.Scan() {
			if in.Text() == "abort" {
				close(aborted)
				return
			}
		}
	}()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-aborted:
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		// Ranks blocked on their reads now fail with a closed connection,
		// which is the abort's doing, not the server's.
		<-finished
		mu.Lock()
		for kind, n := range sr.Errors {
			if strings.HasPrefix(kind, "closed") {
				delete(sr.Errors, kind)
				sr.Errors["aborted"] += n
			}
		}
		mu.Unlock()
	}
	b, _ := json.Marshal(sr)
	fmt.Println(string(b))
	// Hold the connections until the parent is done reading the server.
	for in.Scan() {
	}
	for _, c := range conns {
		c.Close()
	}
	return nil
}

// sourceAddr spreads the ranks' connections over loopback addresses, 64
// to each, so that repeated runs do not run out of ephemeral ports on
// one address while the last run's sockets sit in TIME_WAIT.
func sourceAddr(rank int) *net.TCPAddr {
	i := rank / 64
	return &net.TCPAddr{IP: net.IPv4(127, 1, byte(i/250), byte(i%250+1))}
}

// errorKind names an error for the report: resets, refusals, timeouts,
// hang-ups by the server, and protocol surprises.
func errorKind(err error) string {
	var proto protoError
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case errors.Is(err, net.ErrClosed):
		return "closed"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	case errors.As(err, &proto):
		return "protocol"
	}
	return "other: " + err.Error()
}

type protoError string

func (e protoError) Error() string { return string(e) }

// The query type bytes of each dialect (see the protocol notes).
type opCodes struct{ validate, set, get, add, wait, ping byte }

var (
	codes113 = opCodes{validate: 0xff, set: 0, get: 2, add: 3, wait: 5, ping: 0xff}
	codesV2  = opCodes{validate: 0, set: 1, get: 3, add: 4, wait: 6, ping: 13}
)

const (
	initKey       = "init/" // torch's own, without the "/" every other key gets
	masterKey     = "/sim/master_addr"
	barrierKey    = "/sim/store_based_barrier_key:1"
	lastWorkerKey = "/sim/store_based_barrier_key:1/last_worker"
	masterValue   = "10.0.0.1:29500 0123456789abcdef" // about a rank's address
)

// rankRun is one simulated rank.
type rankRun struct {
	rank, world int
	codes       opCodes
	deadline    time.Time
	local       *net.TCPAddr
	register    func(net.Conn) // to be closed at the end, or at an abort

	conn        net.Conn
	connectedAt int64
	retries     int
	buf         []byte
}

func (r *rankRun) run(addr string) error {
	if err := r.connect(addr); err != nil {
		return err
	}
	if r.codes.validate != 0xff {
		nonce := uint32(os.Getpid())<<16 ^ uint32(r.rank)
		r.buf = binary.LittleEndian.AppendUint32(append(r.buf[:0], r.codes.validate), 0x3C85F7CE)
		r.buf = binary.LittleEndian.AppendUint32(append(r.buf, r.codes.ping), nonce)
		if err := r.send(); err != nil {
			return err
		}
		got, err := r.readU32()
		if err != nil {
			return err
		}
		if got != nonce {
			return protoError(fmt.Sprintf("ping echoed %#x, want %#x", got, nonce))
		}
	}
	r.connectedAt = time.Now().UnixNano()
	if _, err := r.add(initKey, 1); err != nil {
		return err
	}
	if r.rank == 0 {
		r.buf = appendBytes(appendBytes(append(r.buf[:0], r.codes.set), masterKey), masterValue)
		if err := r.send(); err != nil {
			return err
		}
	}
	n, err := r.add(barrierKey, 1)
	if err != nil {
		return err
	}
	if n == int64(r.world) {
		r.buf = appendBytes(appendBytes(append(r.buf[:0], r.codes.set), lastWorkerKey), "1")
		if err := r.send(); err != nil {
			return err
		}
	}
	if err := r.wait(lastWorkerKey); err != nil {
		return err
	}
	if err := r.wait(masterKey); err != nil {
		return err
	}
	r.buf = appendBytes(append(r.buf[:0], r.codes.get), masterKey)
	if err := r.send(); err != nil {
		return err
	}
	size, err := r.readU64()
	if err != nil {
		return err
	}
	if size != uint64(len(masterValue)) {
		return protoError(fmt.Sprintf("get returned %d bytes, want %d", size, len(masterValue)))
	}
	got := make([]byte, size)
	if _, err := io.ReadFull(r.conn, got); err != nil {
		return err
	}
	if string(got) != masterValue {
		return protoError(fmt.Sprintf("get returned %q", got))
	}
	return nil
}

// connect dials as torch's client does, retrying a refused connection
// with a backoff until the deadline.
func (r *rankRun) connect(addr string) error {
	pause := 10 * time.Millisecond
	for {
		d := net.Dialer{Deadline: r.deadline}
		if r.local != nil {
			d.LocalAddr = r.local
			d.Control = noPortAtBind
		}
		c, err := d.Dial("tcp", addr)
		if err == nil {
			r.conn = c
			r.register(c)
			_ = c.SetDeadline(r.deadline)
			return nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ECONNRESET) || time.Now().Add(pause).After(r.deadline) {
			return err
		}
		r.retries++
		time.Sleep(pause)
		pause = min(2*pause, time.Second)
	}
}

// noPortAtBind leaves the choice of the source port to connect, which
// needs only the whole address pair to be unique: a bind to port 0 would
// search for a port free on every address, slower as sockets pile up.
func noPortAtBind(_, _ string, rc syscall.RawConn) error {
	var err error
	if cerr := rc.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	}); cerr != nil {
		return cerr
	}
	return err
}

func (r *rankRun) send() error {
	_, err := r.conn.Write(r.buf)
	return err
}

func (r *rankRun) add(key string, delta int64) (int64, error) {
	r.buf = binary.LittleEndian.AppendUint64(appendBytes(append(r.buf[:0], r.codes.add), key), uint64(delta))
	if err := r.send(); err != nil {
		return 0, err
	}
	n, err := r.readU64()
	return int64(n), err
}

func (r *rankRun) wait(key string) error {
	r.buf = appendBytes(binary.LittleEndian.AppendUint64(append(r.buf[:0], r.codes.wait), 1), key)
	if err := r.send(); err != nil {
		return err
	}
	var b [1]byte
	if _, err := io.ReadFull(r.conn, b[:]); err != nil {
		return err
	}
	if b[0] != 0 {
		return protoError(fmt.Sprintf("wait answered %d, want STOP_WAITING", b[0]))
	}
	return nil
}

func (r *rankRun) readU32() (uint32, error) {
	var b [4]byte
	_, err := io.ReadFull(r.conn, b[:])
	return binary.LittleEndian.Uint32(b[:]), err
}

func (r *rankRun) readU64() (uint64, error) {
	var b [8]byte
	_, err := io.ReadFull(r.conn, b[:])
	return binary.LittleEndian.Uint64(b[:]), err
}

// appendBytes appends a u64 length and s.
func appendBytes(b []byte, s string) []byte {
	return append(binary.LittleEndian.AppendUint64(b, uint64(len(s))), s...)
}
