package collective

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/rendezvous"
)

// The multi-process tests re-execute the test binary as ranks: TestMain
// sees the helper variables and runs a scenario instead of the tests.
const (
	envRank     = "GORUN_COLLECTIVE_TEST_RANK"
	envSize     = "GORUN_COLLECTIVE_TEST_SIZE"
	envStore    = "GORUN_COLLECTIVE_TEST_STORE"
	envScenario = "GORUN_COLLECTIVE_TEST_SCENARIO"
	envBytes    = "GORUN_COLLECTIVE_TEST_BYTES"
	envIters    = "GORUN_COLLECTIVE_TEST_ITERS"
	envProfile  = "GORUN_COLLECTIVE_TEST_CPUPROFILE" // bench: a CPU profile per rank
	envTrace    = "GORUN_COLLECTIVE_TEST_TRACE"      // bench: an execution trace per rank
	envOp       = "GORUN_COLLECTIVE_TEST_OP"         // bench: the collective
	envSlot     = "GORUN_COLLECTIVE_TEST_SLOT"       // bytes of a shared-memory slot
	envSegment  = "GORUN_COLLECTIVE_TEST_SEGMENT"    // bytes of a pipelined frame
	// envNoSingleCopy, when set, turns off single-copy reads between ranks.
	envNoSingleCopy = "GORUN_COLLECTIVE_TEST_NO_SINGLE_COPY"
)

// exitCollectiveFailed is a rank's exit status when a collective failed.
const exitCollectiveFailed = 3

func TestMain(m *testing.M) {
	if os.Getenv(envRank) != "" {
		os.Exit(rankMain())
	}
	os.Exit(m.Run())
}

// rankMain is one rank process: it joins the world through the parent's
// store and runs the scenario, reporting on stdout and failing on stderr.
func rankMain() int {
	rank, _ := strconv.Atoi(os.Getenv(envRank))
	size, _ := strconv.Atoi(os.Getenv(envSize))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	store, err := rendezvous.Dial(ctx, os.Getenv(envStore), rendezvous.ClientOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial store:", err)
		return 1
	}
	defer store.Close()
	slot, _ := strconv.Atoi(os.Getenv(envSlot))
	segment, _ := strconv.Atoi(os.Getenv(envSegment))
	// NewTCP reads no environment; a rank process takes what runtime.Init
	// would from the variables, so that GORUN_ALGO=ring go test -bench
	// works as it does for a worker.
	streams, _ := strconv.Atoi(os.Getenv("GORUN_TCP_STREAMS"))
	c, err := NewTCP(ctx, store, rank, size, TCPOptions{
		Host: "127.0.0.1", shmSlot: slot, segment: segment, noSingleCopy: os.Getenv(envNoSingleCopy) != "",
		Transport: os.Getenv("GORUN_TRANSPORT"), Algorithm: os.Getenv("GORUN_ALGO"), Streams: streams,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "join:", err)
		return 1
	}
	defer c.Close()
	switch scenario := os.Getenv(envScenario); scenario {
	case "collectives":
		err = scenarioCollectives(ctx, c)
	case "allreduce-loop":
		err = scenarioAllReduceLoop(ctx, c)
	case "bench":
		err = scenarioBench(ctx, c)
	default:
		err = fmt.Errorf("unknown scenario %q", scenario)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		return exitCollectiveFailed
	}
	return 0
}

// scenarioCollectives runs one of each collective, checks every result
// against the reference (each rank can compute every rank's input), and
// prints a digest of each so the parent can compare ranks.
func scenarioCollectives(ctx context.Context, c Comm) error {
	n, me := c.Size(), c.Rank()
	report := func(name string, b []byte) {
		fmt.Printf("%s %x\n", name, sha256.Sum256(b))
	}
	inputs := func(dt DType, count int, seed uint64) [][]byte {
		in := make([][]byte, n)
		for r := range in {
			in[r] = make([]byte, count*dt.Size())
			fill(in[r], dt, seed, r)
		}
		return in
	}
	for i, s := range []struct {
		dt    DType
		op    Op
		count int
	}{{Float32, Sum, 1000}, {BFloat16, Avg, 300001}, {Int64, BXor, 7}, {Float64, Max, 1 << 18}} {
		in := inputs(s.dt, s.count, uint64(i))
		want := append([]byte(nil), in[0]...)
		for _, b := range in[1:] {
			ReduceInto(want, b, s.dt, s.op)
		}
		if s.op == Avg {
			divideBy(want, s.dt, n)
		}
		buf := bytes.Clone(in[me])
		if err := c.AllReduce(ctx, buf, s.dt, s.op); err != nil {
			return err
		}
		if !bytes.Equal(buf, want) {
			return fmt.Errorf("all_reduce %v %v: %s", s.dt, s.op, firstDiff(buf, want))
		}
		report(fmt.Sprintf("all_reduce-%d", i), buf)
	}

	large := inputs(Float32, 300001, 9) // past singleCopyBroadcastMin
	buf := bytes.Clone(large[me])
	if err := c.Broadcast(ctx, buf, Float32, n-1); err != nil {
		return err
	}
	if !bytes.Equal(buf, large[n-1]) {
		return errors.New("broadcast: wrong data")
	}
	report("broadcast", buf)

	in := inputs(Float32, 70000, 9)

	out := make([]byte, n*len(in[me]))
	if err := c.AllGather(ctx, out, in[me], Float32); err != nil {
		return err
	}
	if !bytes.Equal(out, bytes.Join(in, nil)) {
		return errors.New("all_gather: wrong data")
	}
	report("all_gather", out)

	counts := make([]int, n)
	for i := range counts {
		counts[i] = 70000 / n
	}
	counts[0] += 70000 % n
	want := append([]byte(nil), in[0]...)
	for _, b := range in[1:] {
		ReduceInto(want, b, Float32, Sum)
	}
	part := make([]byte, counts[me]*4)
	if err := c.ReduceScatter(ctx, part, in[me], Float32, Sum, counts); err != nil {
		return err
	}
	if w := countSpans(counts, 4)[me].of(want); !bytes.Equal(part, w) {
		return fmt.Errorf("reduce_scatter: %s", firstDiff(part, w))
	}

	// all_to_all: rank i sends j the element i*n+j.
	send, recv := make([]int32, n), make([]int32, n)
	ones := make([]int, n)
	for j := range send {
		send[j], ones[j] = int32(me*n+j), 1
	}
	if err := c.AllToAll(ctx, bytesOf(recv), bytesOf(send), Int32, ones, ones); err != nil {
		return err
	}
	for j, v := range recv {
		if v != int32(j*n+me) {
			return fmt.Errorf("all_to_all: from %d got %d", j, v)
		}
	}

	if n > 1 {
		msg := make([]byte, 100000)
		fill(msg, Uint8, 11, me)
		got := make([]byte, len(msg))
		errc := make(chan error, 1)
		go func() { errc <- c.Send(ctx, msg, Uint8, (me+1)%n, 1) }()
		if _, err := c.Recv(ctx, got, Uint8, AnySource, 1); err != nil {
			return err
		}
		if err := <-errc; err != nil {
			return err
		}
		wantMsg := make([]byte, len(msg))
		fill(wantMsg, Uint8, 11, (me+n-1)%n)
		if !bytes.Equal(got, wantMsg) {
			return errors.New("send/recv: wrong data")
		}
	}

	sub, err := c.Split(ctx, []int{n - 1, 0}, "ends")
	if err != nil {
		return err
	}
	if sub != nil {
		v := bytesOf([]int32{int32(me)})
		if err := sub.AllReduce(ctx, v, Int32, Sum); err != nil {
			return err
		}
		if got := view[int32](v)[0]; got != int32(n-1) {
			return fmt.Errorf("split all_reduce: %d", got)
		}
		sub.Close()
	}
	return c.Barrier(ctx)
}

// scenarioAllReduceLoop all-reduces 64 MiB (8 MiB under the race
// detector) until a collective fails, announcing each on stdout.
func scenarioAllReduceLoop(ctx context.Context, c Comm) error {
	size := 64 << 20
	if c.Size() == 2 {
		size = singleCopyAllReduceMax // read from each other's memory
	}
	if raceEnabled {
		size = 8 << 20
	}
	buf := make([]byte, size)
	for i := range 200 {
		fmt.Println("start", i)
		if err := c.AllReduce(ctx, buf, Float32, Sum); err != nil {
			return err
		}
	}
	return errors.New("no collective failed")
}

// scenarioBench times one float32 collective ($GORUN_COLLECTIVE_TEST_OP,
// all_reduce by default, a sum where it reduces) of
// $GORUN_COLLECTIVE_TEST_BYTES bytes in all (nccl-tests' size: the
// buffer of all_reduce and broadcast, the concatenation of all_gather,
// reduce_scatter and all_to_all), $GORUN_COLLECTIVE_TEST_ITERS times after
// a warm-up, and prints the median, the shortest and the mean time of one.
func scenarioBench(ctx context.Context, c Comm) error {
	size, _ := strconv.Atoi(os.Getenv(envBytes))
	iters, _ := strconv.Atoi(os.Getenv(envIters))
	run, err := benchCall(c, os.Getenv(envOp), size)
	if err != nil {
		return err
	}
	for range 3 {
		if err := run(ctx); err != nil {
			return err
		}
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	if path := os.Getenv(envProfile); path != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", path, c.Rank()))
		if err != nil {
			return err
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if path := os.Getenv(envTrace); path != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", path, c.Rank()))
		if err != nil {
			return err
		}
		defer f.Close()
		trace.Start(f)
		defer trace.Stop()
	}
	// Each call timed alone: the median and the fastest say more than
	// the mean on a machine whose other work takes the cores at times.
	took := make([]time.Duration, iters)
	began := time.Now()
	for i := range took {
		start := time.Now()
		if err := run(ctx); err != nil {
			return err
		}
		took[i] = time.Since(start)
	}
	mean := time.Since(began) / time.Duration(iters)
	slices.Sort(took)
	fmt.Println(took[len(took)/2], took[0], mean)
	return nil
}

// benchCall returns one call of the collective op on buffers for size
// bytes in all, as nccl-tests sizes it. The buffers are filled: a buffer
// never written maps the zero page, which every read finds in the cache.
func benchCall(c Comm, op string, size int) (func(context.Context) error, error) {
	n := c.Size()
	per := size / 4 / n * 4 // one rank's piece, whole float32s
	filled := func(n int) []byte {
		b := make([]byte, n)
		fill(b, Float32, 1, c.Rank())
		return b
	}
	switch op {
	case "", "allreduce":
		buf := filled(size)
		return func(ctx context.Context) error { return c.AllReduce(ctx, buf, Float32, Sum) }, nil
	case "broadcast":
		buf := filled(size)
		return func(ctx context.Context) error { return c.Broadcast(ctx, buf, Float32, 0) }, nil
	case "allgather":
		in, out := filled(per), filled(n*per)
		return func(ctx context.Context) error { return c.AllGather(ctx, out, in, Float32) }, nil
	case "reduce_scatter":
		in, out := filled(n*per), filled(per)
		counts := slices.Repeat([]int{per / 4}, n)
		return func(ctx context.Context) error { return c.ReduceScatter(ctx, out, in, Float32, Sum, counts) }, nil
	case "alltoall":
		in, out := filled(n*per), filled(n*per)
		counts := slices.Repeat([]int{per / 4}, n)
		return func(ctx context.Context) error { return c.AllToAll(ctx, out, in, Float32, counts, counts) }, nil
	}
	return nil, fmt.Errorf("unknown collective %q", op)
}

// rankProc is a rank process started by the parent test.
type rankProc struct {
	cmd    *exec.Cmd
	lines  chan string // stdout, line by line; closed at EOF
	stderr bytes.Buffer
	done   chan struct{} // closed when the process has exited
	err    error         // its Wait error, once done
	exited time.Time
}

// startRanks starts n rank processes running scenario, meeting through a
// rendezvous server of the parent's on 127.0.0.1.
func startRanks(t testing.TB, n int, scenario string, env ...string) []*rankProc {
	t.Helper()
	srv := rendezvous.NewServer(rendezvous.ServerOptions{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	procs := make([]*rankProc, n)
	for r := range procs {
		p := &rankProc{lines: make(chan string, 1024), done: make(chan struct{})}
		p.cmd = exec.Command(os.Args[0], "-test.run=^$")
		p.cmd.Env = append(os.Environ(),
			envRank+"="+strconv.Itoa(r),
			envSize+"="+strconv.Itoa(n),
			envStore+"="+ln.Addr().String(),
			envScenario+"="+scenario,
		)
		p.cmd.Env = append(p.cmd.Env, env...)
		p.cmd.Stderr = &p.stderr
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				p.lines <- sc.Text()
			}
			io.Copy(io.Discard, stdout)
			close(p.lines)
			p.err = p.cmd.Wait()
			p.exited = time.Now()
			close(p.done)
		}()
		procs[r] = p
	}
	t.Cleanup(func() {
		for _, p := range procs {
			p.cmd.Process.Kill() // by pid; a no-op once it has exited
			<-p.done
		}
	})
	return procs
}

func waitExit(t testing.TB, p *rankProc, d time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("rank pid %d still running after %v; stderr:\n%s", p.cmd.Process.Pid, d, p.stderr.String())
	}
}

func TestProcessesRunCollectives(t *testing.T) {
	for _, n := range []int{2, 5} {
		t.Run(fmt.Sprintf("world=%d", n), func(t *testing.T) {
			procs := startRanks(t, n, "collectives")
			digests := make([][]string, n)
			for r, p := range procs {
				for line := range p.lines {
					digests[r] = append(digests[r], line)
				}
				waitExit(t, p, 60*time.Second)
				if p.err != nil {
					t.Fatalf("rank %d: %v\n%s", r, p.err, p.stderr.String())
				}
			}
			for r := 1; r < n; r++ {
				if strings.Join(digests[r], "\n") != strings.Join(digests[0], "\n") {
					t.Fatalf("rank %d's results differ from rank 0's:\n%v\n%v", r, digests[r], digests[0])
				}
			}
			if len(digests[0]) != 6 {
				t.Fatalf("rank 0 reported %d results", len(digests[0]))
			}
		})
	}
}

// TestProcessKilledDuringAllReduce: kill -9 one rank in the middle of a
// 64 MiB all_reduce; every other rank fails within 5 s, naming it.
func TestProcessKilledDuringAllReduce(t *testing.T) {
	for _, tc := range []struct {
		transport string
		n, victim int
	}{
		{"auto", 4, 2},
		{"unix", 4, 2},
		{"tcp", 4, 2},
		// Two ranks in shared memory read each other's buffers
		// (allReducePairSingleCopy).
		{"auto", 2, 1},
	} {
		t.Run(fmt.Sprintf("%s/world=%d", tc.transport, tc.n), func(t *testing.T) {
			before := sharedSegments(t)
			testKillDuringAllReduce(t, tc.n, tc.victim, "GORUN_TRANSPORT="+tc.transport)
			// The survivors have exited too; the victim never closed.
			expectNoNewSegments(t, before)
		})
	}
}

func testKillDuringAllReduce(t *testing.T, n, victim int, env ...string) {
	procs := startRanks(t, n, "allreduce-loop", env...)
	// Kill it once its third all_reduce has begun: the first two prove
	// the world works, and the third is surely in flight.
	for line := range procs[victim].lines {
		if line == "start 2" {
			break
		}
	}
	if err := procs[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for r, p := range procs {
		if r == victim {
			continue
		}
		go func() {
			for range p.lines {
			}
		}()
		waitExit(t, p, 30*time.Second)
		var ee *exec.ExitError
		if !errors.As(p.err, &ee) || ee.ExitCode() != exitCollectiveFailed {
			t.Errorf("rank %d: exit %v; stderr:\n%s", r, p.err, p.stderr.String())
			continue
		}
		msg := p.stderr.String()
		if !strings.Contains(msg, fmt.Sprintf("rank %d", victim)) {
			t.Errorf("rank %d: error does not name rank %d: %s", r, victim, msg)
		}
		if d := p.exited.Sub(killed); d > 5*time.Second {
			t.Errorf("rank %d failed %v after the kill", r, d)
		}
		t.Logf("rank %d after %v: %s", r, p.exited.Sub(killed).Round(time.Millisecond), strings.TrimSpace(msg))
	}
}
