package collective

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// These tests drive the socket paths (inConn, outConn, the poller) through
// the public API over loopback: "tcp" and "unix" keep shared memory out,
// so every byte crosses a socket.
var socketTransports = []string{"tcp", "unix"}

// streamBytes returns n reproducible bytes that repeat nowhere, so that a
// segment delivered at the wrong offset shows.
func streamBytes(n int, seed uint64) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	return b
}

// waitFor polls cond until it holds or d passes, and reports whether it
// held: the tests wait on the transport's state rather than sleeping.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); ; {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// TestSimultaneousLargeSends: two ranks send each other 48 MiB at once,
// both sending before receiving, far more than the sockets buffer. Each
// Send returns only once its peer has read most of it, which no receive
// of the peer's does yet: its poller must, while the peer's own op is
// busy writing. Three rounds, so that later ones start on connections
// that spinning receives left unarmed; and once more in a process with
// one P, which the transport raises to two (ensureTwoPs) so that its
// poller never waits for a spinning op to give the P up.
func TestSimultaneousLargeSends(t *testing.T) {
	size := 48 << 20
	if raceEnabled {
		size = 24 << 20 // still beyond what both sockets buffer
	}
	out := [2][]byte{streamBytes(size, 1), streamBytes(size, 2)}
	for _, procs := range []int{0, 1} { // 0: as the test runs
		for _, transport := range socketTransports {
			name := transport + "/gomaxprocs=default"
			if procs > 0 {
				name = fmt.Sprintf("%s/gomaxprocs=%d", transport, procs)
			}
			t.Run(name, func(t *testing.T) {
				if procs > 0 {
					prev := runtime.GOMAXPROCS(procs)
					t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
				}
				comms := testWorld(t, 2, TCPOptions{Transport: transport})
				if got := runtime.GOMAXPROCS(0); got < 2 {
					t.Fatalf("GOMAXPROCS is %d after the world started, want at least 2", got)
				}
				ctx := testContext(t, 30*time.Second)
				in := [2][]byte{make([]byte, size), make([]byte, size)}
				for round := range 3 {
					start := time.Now()
					mustAll(t, fmt.Sprintf("round %d", round), onAll(comms, func(r int, c Comm) error {
						peer := 1 - r
						if err := c.Send(ctx, out[r], Uint8, peer, round); err != nil {
							return fmt.Errorf("send: %w", err)
						}
						if _, err := c.Recv(ctx, in[r], Uint8, peer, round); err != nil {
							return fmt.Errorf("recv: %w", err)
						}
						return nil
					}))
					for r := range in {
						if !bytes.Equal(in[r], out[1-r]) {
							t.Fatalf("round %d: rank %d received other bytes: %s", round, r, firstDiff(in[r], out[1-r]))
						}
						clear(in[r])
					}
					t.Logf("round %d: %v", round, time.Since(start).Round(time.Millisecond))
				}
			})
		}
	}
}

// TestReceiversParkAndWake: receives from one peer on several tags at
// once, by several goroutines. The first message comes at once, while the
// others spin on the connection; the rest come only after their
// receivers have parked, in the reverse order, so the poller must take
// the connection back from the spinners and read frames into buffers
// whose ops sleep. Sizes cover a buffered frame, one read through the
// buffer and frames read straight into the receiver's buffer.
func TestReceiversParkAndWake(t *testing.T) {
	sizes := []int{100, 70000, 1<<20 + 3, 5 << 20}
	msgs := make([][]byte, len(sizes))
	for tag, n := range sizes {
		msgs[tag] = streamBytes(n, uint64(10+tag))
	}
	for _, transport := range socketTransports {
		t.Run(transport, func(t *testing.T) {
			comms := testWorld(t, 2, TCPOptions{Transport: transport})
			ctx := testContext(t, 30*time.Second)
			receiver := comms[1].(*comm).t
			for round := range 3 {
				errs := onAll(comms, func(r int, c Comm) error {
					if r == 0 {
						if err := c.Send(ctx, msgs[0], Uint8, 1, 0); err != nil {
							return fmt.Errorf("send tag 0: %w", err)
						}
						// Every other receiver has given up spinning.
						if !waitFor(10*time.Second, func() bool { return receiver.parked.Load() >= int32(len(sizes)-1) }) {
							return fmt.Errorf("%d receivers parked, want %d", receiver.parked.Load(), len(sizes)-1)
						}
						for tag := len(sizes) - 1; tag > 0; tag-- {
							if err := c.Send(ctx, msgs[tag], Uint8, 1, tag); err != nil {
								return fmt.Errorf("send tag %d: %w", tag, err)
							}
						}
						return nil
					}
					errc := make(chan error, len(sizes))
					for tag := range sizes {
						go func() {
							buf := make([]byte, sizes[tag])
							if _, err := c.Recv(ctx, buf, Uint8, 0, tag); err != nil {
								errc <- fmt.Errorf("recv tag %d: %w", tag, err)
								return
							}
							if !bytes.Equal(buf, msgs[tag]) {
								errc <- fmt.Errorf("tag %d: %s", tag, firstDiff(buf, msgs[tag]))
								return
							}
							errc <- nil
						}()
					}
					var errs []error
					for range sizes {
						errs = append(errs, <-errc)
					}
					return errors.Join(errs...)
				})
				mustAll(t, fmt.Sprintf("round %d", round), errs)
			}
		})
	}
}

// pingPong runs rounds of a one-byte message from rank 0 on tag 2
// answered by rank 1 on tag 3, so that each side's receive spins on its
// connection while the other's frame comes; rank 0 ends the exchange by
// sending 1, once more returns false.
type pingPong struct {
	ctx  context.Context
	c    Comm
	ping [1]byte
}

const (
	pingTag = 2
	pongTag = 3
)

// ask is rank 0's round: more says whether another follows.
func (p *pingPong) ask(more bool) error {
	p.ping[0] = 0
	if !more {
		p.ping[0] = 1
	}
	if err := p.c.Send(p.ctx, p.ping[:], Uint8, 1, pingTag); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	if _, err := p.c.Recv(p.ctx, p.ping[:], Uint8, 1, pongTag); err != nil {
		return fmt.Errorf("pong: %w", err)
	}
	return nil
}

// answer is rank 1's round; it returns whether another follows.
func (p *pingPong) answer() (bool, error) {
	if _, err := p.c.Recv(p.ctx, p.ping[:], Uint8, 0, pingTag); err != nil {
		return false, fmt.Errorf("ping: %w", err)
	}
	more := p.ping[0] == 0
	if err := p.c.Send(p.ctx, p.ping[:], Uint8, 0, pongTag); err != nil {
		return false, fmt.Errorf("pong: %w", err)
	}
	return more, nil
}

// TestUnawaitedFramesReadWhileOpsSpin: while rank 1's ops spin on rank
// 0's connection (a ping-pong on other tags, or tiny all_reduces of a
// split sharing the connection), rank 0 sends 32 MiB on a tag rank 1 has
// not asked for. That Send returns only once rank 1 has read most of it,
// and rank 1 reads only as its spinning ops pump the connection: no
// parked op wakes the poller. Rank 0 ends the spinning once its Send has
// returned (and a few hundred rounds have passed); then rank 1's receive
// finds the message.
func TestUnawaitedFramesReadWhileOpsSpin(t *testing.T) {
	const size, tag = 32 << 20, 1
	msg := streamBytes(size, 3)
	for _, transport := range socketTransports {
		for _, spinner := range []string{"recv", "all_reduce"} {
			t.Run(transport+"/"+spinner, func(t *testing.T) {
				comms := testWorld(t, 2, TCPOptions{Transport: transport})
				ctx := testContext(t, 30*time.Second)
				subs := make([]Comm, 2)
				mustAll(t, "split", onAll(comms, func(r int, c Comm) (err error) {
					subs[r], err = c.Split(ctx, []int{0, 1}, "spin")
					return err
				}))
				got := make([]byte, size)
				mustAll(t, "spinning", onAll(comms, func(r int, c Comm) error {
					sent := make(chan error, 1)
					if r == 0 {
						go func() { sent <- c.Send(ctx, msg, Uint8, 1, tag) }()
					}
					// Rank 0 keeps rank 1 spinning until its Send is
					// done, or gives up after a bound far beyond what
					// 32 MiB takes.
					// A few hundred rounds at least, so that frames
					// are also read after the Send is done.
					const minRounds = 300
					giveUp := time.After(10 * time.Second)
					var sendErr error
					sendDone := false
					rounds := 0
					more := func() bool {
						if !sendDone {
							select {
							case sendErr = <-sent:
								sendDone = true
								t.Logf("rank 0's send returned after %d rounds", rounds)
							case <-giveUp:
								sendErr, sendDone = errors.New("still unsent after 10s of spinning receives"), true
							default:
							}
						}
						return !sendDone || rounds < minRounds
					}
					if spinner == "recv" {
						p := &pingPong{ctx: ctx, c: c}
						for going := true; going; rounds++ {
							var err error
							if r == 0 {
								going = more()
								err = p.ask(going)
							} else {
								going, err = p.answer()
							}
							if err != nil {
								return fmt.Errorf("round %d: %w", rounds, err)
							}
						}
					} else {
						flag := make([]byte, 4)
						for going := true; going; rounds++ {
							flag[0] = 0
							if r == 0 && !more() {
								flag[0] = 1
							}
							if err := subs[r].AllReduce(ctx, flag, Int32, Max); err != nil {
								return fmt.Errorf("all_reduce %d: %w", rounds, err)
							}
							going = flag[0] == 0
						}
					}
					if r == 0 {
						if sendErr != nil {
							return fmt.Errorf("send after %d rounds: %w", rounds, sendErr)
						}
						return nil
					}
					t.Logf("%d rounds of %s", rounds, spinner)
					rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					defer cancel()
					if _, err := c.Recv(rctx, got, Uint8, 0, tag); err != nil {
						return fmt.Errorf("recv: %w", err)
					}
					return nil
				}))
				if !bytes.Equal(got, msg) {
					t.Fatalf("message: %s", firstDiff(got, msg))
				}
			})
		}
	}
}

// TestIdleConnectionStillRead: once the ops that spun on a connection are
// gone and none is parked, the poller leaves the connection unarmed, but
// not for good. With no op in flight on rank 1, rank 0's 32 MiB Send
// (which needs rank 1 to read) still completes, and rank 0's close is
// still noticed.
func TestIdleConnectionStillRead(t *testing.T) {
	const size, tag = 32 << 20, 9
	msg := streamBytes(size, 4)
	for _, transport := range socketTransports {
		t.Run(transport, func(t *testing.T) {
			comms := testWorld(t, 2, TCPOptions{Transport: transport})
			ctx := testContext(t, 30*time.Second)
			receiver := comms[1].(*comm).t
			// Spin until the poller has left rank 0's connection idle.
			idle := func() bool {
				ic := receiver.incoming(0, 0)
				return ic != nil && ic.idle.Load()
			}
			restLeft := func(what string) {
				t.Helper()
				var asked int
				mustAll(t, what, onAll(comms, func(r int, c Comm) error {
					p := &pingPong{ctx: ctx, c: c}
					for going := true; going; {
						var err error
						if r == 0 {
							going = asked < 10000 && !idle()
							asked++
							err = p.ask(going)
						} else {
							going, err = p.answer()
						}
						if err != nil {
							return err
						}
					}
					return nil
				}))
				t.Logf("%s: idle %v after %d rounds", what, idle(), asked)
			}
			restLeft("first ping-pong")
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := comms[0].Send(sctx, msg, Uint8, 1, tag); err != nil {
				t.Fatalf("send to a rank with no op in flight: %v", err)
			}
			got := make([]byte, size)
			if _, err := comms[1].Recv(ctx, got, Uint8, 0, tag); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, msg) {
				t.Fatalf("message: %s", firstDiff(got, msg))
			}
			restLeft("second ping-pong")
			if err := comms[0].Close(); err != nil {
				t.Fatal(err)
			}
			if !waitFor(10*time.Second, func() bool { return receiver.peerGone(0) != nil }) {
				t.Fatal("rank 1 never noticed that rank 0 closed")
			}
		})
	}
}

// TestSendSucceedsWhenPeerClosesAfterReceiving: a frame written whole is
// sent, even when the peer reads it and closes at once, possibly before
// the sender has finished the frame's bookkeeping: the Send must not fail
// because of the close. Small frames are written by the sender itself,
// large ones by the op and then the writer goroutine; the receiver
// either waits for the message or finds it already read.
func TestSendSucceedsWhenPeerClosesAfterReceiving(t *testing.T) {
	const runs = 50
	sizes := []int{200, 4 << 20}
	msgs := make([][]byte, len(sizes))
	for i, n := range sizes {
		msgs[i] = streamBytes(n, uint64(20+i))
	}
	for i := range runs {
		transport := socketTransports[i%2]
		msg := msgs[i/2%2]
		late := i/4%2 == 1 // the receiver posts once frames have come
		what := fmt.Sprintf("run %d (%s, %d bytes, late %v)", i, transport, len(msg), late)
		comms := testWorld(t, 2, TCPOptions{Transport: transport})
		ctx := testContext(t, 20*time.Second)
		got := make([]byte, len(msg))
		errs := onAll(comms, func(r int, c Comm) error {
			if r == 0 {
				return c.Send(ctx, msg, Uint8, 1, 0)
			}
			defer c.Close()
			if late {
				tr := c.(*comm).t
				key := boxKey{comm: worldID, src: 0, p2p: true}
				queued := func() bool {
					tr.match.mu.Lock()
					defer tr.match.mu.Unlock()
					b := tr.match.boxes[key]
					return b != nil && len(b.frames) > 0
				}
				if !waitFor(10*time.Second, queued) {
					return errors.New("no frame came")
				}
			}
			_, err := c.Recv(ctx, got, Uint8, 0, 0)
			return err
		})
		mustAll(t, what, errs)
		if !bytes.Equal(got, msg) {
			t.Fatalf("%s: %s", what, firstDiff(got, msg))
		}
		comms[0].Close()
	}
}

// impostor speaks for rank 0 to rank 1 of a world whose rank 0 has not
// connected: it says hello on rank 1's port and writes what it is told.
func impostor(t *testing.T, target Comm, size int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", target.(*comm).t.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var b [headerSize]byte
	h := header{kind: kindHello, root: 0, count: uint64(size)}
	h.encode(&b)
	if _, err := c.Write(b[:]); err != nil {
		t.Fatal(err)
	}
	return c
}

// sendFrame is the frame of a one-segment Send of payload on tag.
func sendFrame(tag int, payload []byte) []byte {
	var b [headerSize]byte
	h := header{kind: kindData, coll: collSend, comm: worldID, dtype: Uint8, tag: int32(tag),
		count: uint64(len(payload)), length: uint32(len(payload))}
	h.encode(&b)
	return append(b[:], payload...)
}

// TestGarbageAfterHelloFailsThatPeer: a connection that said a valid
// hello and sent a valid frame then breaks the protocol. The frame before
// the garbage is still delivered; receives from that peer then fail with
// an error saying what was wrong, whether they were posted after the
// garbage came or were parked when it came; the connection is closed;
// and the poller goes on reading the other peers' connections.
func TestGarbageAfterHelloFailsThatPeer(t *testing.T) {
	// garbage is a valid frame edited.
	garbage := func(edit func(frame []byte)) []byte {
		frame := sendFrame(6, make([]byte, 16))
		edit(frame)
		return frame
	}
	cases := []struct {
		name  string
		bytes []byte
		want  string
	}{
		{"magic", garbage(func(b []byte) { b[0] ^= 0xff }), "bad frame magic"},
		{"version", garbage(func(b []byte) { b[2] = frameVersion + 1 }), "bad frame magic"},
		{"kind", garbage(func(b []byte) { b[3] = 99 }), "unknown frame kind 99"},
		{"hello again", garbage(func(b []byte) {
			h := header{kind: kindHello, root: 0, count: 3}
			h.encode((*[headerSize]byte)(b))
		}), "unexpected frame kind 1"},
		{"oversized", garbage(func(b []byte) {
			binary.LittleEndian.PutUint32(b[48:], maxPayload+1)
		}), "-byte payload in a kind 2 frame"},
		{"text", []byte("this is not a frame header, not at all, not even close to one..."), "bad frame magic"},
	}
	// More than rank 2's and rank 1's socket buffers hold together.
	big := streamBytes(24<<20, 6)
	for _, tc := range cases {
		for _, parked := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/parked=%v", tc.name, parked), func(t *testing.T) {
				comms := testWorld(t, 3, TCPOptions{Transport: "unix"})
				ctx := testContext(t, 20*time.Second)
				tr := comms[1].(*comm).t
				conn := impostor(t, comms[1], 3)
				valid := streamBytes(1000, 5)
				if _, err := conn.Write(sendFrame(5, valid)); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, len(valid))
				if _, err := comms[1].Recv(ctx, got, Uint8, 0, 5); err != nil {
					t.Fatalf("the frame before the garbage: %v", err)
				}
				if !bytes.Equal(got, valid) {
					t.Fatalf("the frame before the garbage: %s", firstDiff(got, valid))
				}
				recvErr := make(chan error, 1)
				recv := func() {
					_, err := comms[1].Recv(ctx, make([]byte, 16), Uint8, 0, 6)
					recvErr <- err
				}
				if parked {
					go recv()
					if !waitFor(10*time.Second, func() bool { return tr.parked.Load() > 0 }) {
						t.Fatal("the receive never parked")
					}
				}
				if _, err := conn.Write(tc.bytes); err != nil {
					t.Fatal(err)
				}
				if !parked {
					// The poller alone finds the garbage: no op reads.
					if !waitFor(10*time.Second, func() bool { return tr.peerGone(0) != nil }) {
						t.Fatal("the garbage went unnoticed")
					}
					go recv()
				}
				checkGarbageError(t, <-recvErr, tc.want)
				// Later receives fail at once, with the same cause.
				_, err := comms[1].Recv(ctx, make([]byte, 16), Uint8, 0, 7)
				checkGarbageError(t, err, tc.want)

				// Rank 1 hung up on the impostor.
				conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				if n, err := conn.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
					t.Errorf("the impostor's connection: read %d bytes, %v; want it closed", n, err)
				}

				// The poller still reads rank 2: a Send that rank 1's
				// buffers cannot hold completes before rank 1 receives.
				// The world failed with the receive (its members were
				// told), so ranks 1 and 2 talk through a communicator
				// of their own on the same connections.
				pair := pairComm(t, comms[1], comms[2])
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if err := pair[1].Send(sctx, big, Uint8, 0, 8); err != nil {
					t.Fatalf("rank 2 to rank 1 after the garbage: %v", err)
				}
				got = make([]byte, len(big))
				if _, err := pair[0].Recv(ctx, got, Uint8, 1, 8); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, big) {
					t.Fatalf("rank 2's message: %s", firstDiff(got, big))
				}
			})
		}
	}
}

// pairComm makes a communicator of the world ranks of a and b, in that
// order, on their transports, without the world's traffic a Split needs.
func pairComm(t *testing.T, a, b Comm) [2]Comm {
	t.Helper()
	const id = 0x5eed
	members := []int{a.Rank(), b.Rank()}
	var pair [2]Comm
	for i, w := range []Comm{a, b} {
		c := newComm(w.(*comm).t, id, i, members)
		if err := c.t.register(c); err != nil {
			t.Fatal(err)
		}
		pair[i] = c
	}
	return pair
}

func checkGarbageError(t *testing.T, err error, want string) {
	t.Helper()
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 0 || !strings.Contains(err.Error(), want) {
		t.Fatalf("receive from the peer that sent garbage: %v; want a PeerError naming rank 0 and saying %q", err, want)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Garbage read by an op spinning on the connection fails the receive at
// once: the socket then stays silent, so the poller would never report it.
func TestGarbageReadBySpinningOpFailsReceive(t *testing.T) {
	// The op spins until the garbage comes, however late the test sees
	// it spin on a busy machine.
	comms := testWorld(t, 2, TCPOptions{Transport: "unix", yieldSpin: time.Minute})
	tr := comms[1].(*comm).t
	conn := impostor(t, comms[1], 2)
	if !waitFor(5*time.Second, func() bool { return tr.incoming(0, 0) != nil }) {
		t.Fatal("no inConn")
	}
	ic := tr.incoming(0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := comms[1].Recv(ctx, make([]byte, 16), Uint8, 0, 6)
		errc <- err
	}()
	if !waitFor(5*time.Second, func() bool { return ic.spinners.Load() > 0 }) {
		t.Fatal("never spun")
	}
	conn.Write([]byte("this is not a frame header, not at all, not even close to one..."))
	start := time.Now()
	err := <-errc
	t.Logf("after %v: %v", time.Since(start), err)
	if err == nil || !strings.Contains(err.Error(), "bad frame magic") {
		t.Fatalf("got %v", err)
	}
}

// Closing the communicator while a frame is half-read into a receive
// fails that receive instead of leaving it waiting.
func TestCloseWhileFillingFailsReceive(t *testing.T) {
	comms := testWorld(t, 2, TCPOptions{Transport: "unix"})
	tr := comms[1].(*comm).t
	conn := impostor(t, comms[1], 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := comms[1].Recv(ctx, make([]byte, defaultSegment), Uint8, 0, 7) // one frame
		errc <- err
	}()
	if !waitFor(5*time.Second, func() bool { return tr.parked.Load() > 0 }) {
		t.Fatal("never parked")
	}
	frame := sendFrame(7, make([]byte, defaultSegment))
	conn.Write(frame[:len(frame)/2])
	if !waitFor(5*time.Second, func() bool { return tr.incoming(0, 0) != nil }) {
		t.Fatal("the connection was never accepted")
	}
	ic := tr.incoming(0, 0)
	filling := func() bool {
		rd := ic.take()
		defer rd.give()
		return rd.req != nil && rd.got > 0
	}
	if !waitFor(5*time.Second, filling) {
		t.Fatal("never filling")
	}
	comms[1].Close()
	select {
	case err := <-errc:
		t.Logf("recv: %v", err)
		if !errors.Is(err, ErrClosed) {
			t.Errorf("got %v", err)
		}
	case <-time.After(5 * time.Second):
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		s := string(buf[:n])
		i := strings.Index(s, "waitOrCut")
		lo := max(0, i-1500)
		t.Fatalf("Recv still blocked 5s after Close:\n%s", s[lo:min(len(s), i+800)])
	}
}

// A small Send to a peer that stops reading still ends at its deadline.
func TestSmallSendHonoursContextWhenPeerStopsReading(t *testing.T) {
	comms := testWorld(t, 2, TCPOptions{Transport: "tcp"})
	ctx := testContext(t, 20*time.Second)
	// Connect, and let rank 1 read.
	if err := comms[0].Send(ctx, make([]byte, 8), Uint8, 1, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := comms[1].Recv(ctx, make([]byte, 8), Uint8, 0, 0); err != nil {
		t.Fatal(err)
	}
	ic := comms[1].(*comm).t.incoming(0, 0)
	rd := ic.take() // nobody on rank 1 can read now
	given := false
	defer func() {
		if !given {
			rd.give()
		}
	}()
	done := make(chan error, 1)
	var sends int
	go func() {
		for i := range 2000 {
			sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			err := comms[0].Send(sctx, make([]byte, 60<<10), Uint8, 1, 1)
			cancel()
			if err != nil {
				sends = i
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		t.Logf("after %d sends: %v", sends, err)
	case <-time.After(5 * time.Second):
		rd.give()
		given = true
		err := <-done
		t.Fatalf("a 60 KiB Send with a 300ms deadline was still blocked 5s later (returned %v once the peer read again)", err)
	}
}

// TestReadAheadIsBounded: a broadcast's root that calls far ahead of its
// receiver fills no more of the receiver's memory than heldLimit (and a
// frame): the rest waits in the socket, and the root waits for the
// receiver, rather than the receiver buffering without end. Then every
// broadcast arrives whole and in order. Send/recv frames, which are read
// however far ahead, are TestSimultaneousLargeSends'.
func TestReadAheadIsBounded(t *testing.T) {
	const calls, size = 64, 1 << 20
	for _, transport := range socketTransports {
		t.Run(transport, func(t *testing.T) {
			comms := testWorld(t, 2, TCPOptions{Transport: transport})
			ctx := testContext(t, 30*time.Second)
			var done atomic.Int32 // broadcasts the root has finished
			rootErr := make(chan error, 1)
			go func() {
				for i := range calls {
					if err := comms[0].Broadcast(ctx, streamBytes(size, uint64(i)), Uint8, 0); err != nil {
						rootErr <- err
						return
					}
					done.Add(1)
				}
				rootErr <- nil
			}()
			// Wait for the root to stop getting ahead.
			last, steadySince := int32(-1), time.Now()
			waitFor(20*time.Second, func() bool {
				if n := done.Load(); n != last || n == calls {
					last, steadySince = n, time.Now()
					return n == calls
				}
				return time.Since(steadySince) > 300*time.Millisecond
			})
			tr := comms[1].(*comm).t
			tr.match.mu.Lock()
			held := tr.match.peers[0].held
			tr.match.mu.Unlock()
			if held > heldLimit+size {
				t.Errorf("the receiver holds %d bytes read ahead, past the bound of %d and a frame", held, heldLimit)
			}
			if n := done.Load(); n == calls {
				t.Errorf("the root finished all %d broadcasts of %d bytes before the receiver asked for one", calls, size)
			} else {
				t.Logf("the root got %d broadcasts ahead; %d bytes held", n, held)
			}
			for i := range calls {
				got := make([]byte, size)
				if err := comms[1].Broadcast(ctx, got, Uint8, 0); err != nil {
					t.Fatalf("broadcast %d: %v", i, err)
				}
				if want := streamBytes(size, uint64(i)); !bytes.Equal(got, want) {
					t.Fatalf("broadcast %d: %s", i, firstDiff(got, want))
				}
			}
			if err := <-rootErr; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEarlyFramesLendTheirBuffers: a rank that reaches an all_reduce late
// finds its peer's first frames read ahead, and reduces from their
// buffers instead of a copy (matching.fill). Three calls in a row, each late,
// must all come out right: a lent buffer goes back to the pool only once
// its op is done with it.
func TestEarlyFramesLendTheirBuffers(t *testing.T) {
	for _, algo := range []string{"ring", "rhd"} {
		t.Run(algo, func(t *testing.T) {
			comms := testWorld(t, 2, TCPOptions{TCPOnly: true, Algorithm: algo, segment: 4 << 10})
			ctx := testContext(t, 30*time.Second)
			tr := comms[1].(*comm).t
			const count = 64 << 10
			for call := range 3 {
				inputs := [2][]byte{make([]byte, 4*count), make([]byte, 4*count)}
				for r := range inputs {
					fill(inputs[r], Float32, uint64(call), r)
				}
				want := reference(t, inputs[:], Float32, Sum)
				early := make(chan error, 1)
				go func() { early <- comms[0].AllReduce(ctx, inputs[0], Float32, Sum) }()
				held := func() bool {
					tr.match.mu.Lock()
					defer tr.match.mu.Unlock()
					return tr.match.peers[0].held > 0
				}
				if !waitFor(10*time.Second, held) {
					t.Fatalf("call %d: rank 0's frames were never read ahead", call)
				}
				if err := comms[1].AllReduce(ctx, inputs[1], Float32, Sum); err != nil {
					t.Fatal(err)
				}
				if err := <-early; err != nil {
					t.Fatal(err)
				}
				for r, got := range inputs {
					if !bytes.Equal(got, want) {
						t.Fatalf("call %d: rank %d: %s", call, r, firstDiff(got, want))
					}
				}
			}
		})
	}
}
