package collective

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/rendezvous"
)

func TestCheckStreams(t *testing.T) {
	for _, tc := range []struct {
		n, want int
		err     string
	}{
		{0, 0, ""}, // streamsAsked chooses
		{1, 1, ""},
		{16, 16, ""},
		{17, 0, "want 1 to 16"},
		{-1, 0, "want 1 to 16"},
	} {
		got, err := checkStreams(tc.n)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("checkStreams(%d) = %d, %v; want an error saying %q", tc.n, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("checkStreams(%d) = %d, %v; want %d", tc.n, got, err, tc.want)
		}
	}
}

// TestTransportMode: TCPOnly means TCP whatever Transport says; names
// are case- and space-insensitive; an unknown one is an error.
func TestTransportMode(t *testing.T) {
	for _, tc := range []struct {
		transport string
		tcpOnly   bool
		want      string
		err       string
	}{
		{"", false, "auto", ""},
		{"auto", false, "auto", ""},
		{" Unix ", false, "unix", ""},
		{"tcp", false, "tcp", ""},
		{"", true, "tcp", ""},
		{"unix", true, "tcp", ""},
		{"shm", false, "", `unknown transport "shm"`},
	} {
		got, err := TCPOptions{Transport: tc.transport, TCPOnly: tc.tcpOnly}.transportMode()
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("Transport %q, TCPOnly %v: %q, %v; want %q, error %q", tc.transport, tc.tcpOnly, got, err, tc.want, tc.err)
		}
	}
}

// TestStreamsAsked: a rank asks for what it named; else, alone on its
// host or with hosts unknown, for defaultStreams; else for
// defaultStreams shared among its host's connections to the other hosts
// (a rank here and a host there each), at least one.
func TestStreamsAsked(t *testing.T) {
	for _, tc := range []struct {
		named, hostRanks, hosts, want int
	}{
		{0, 0, 0, defaultStreams},
		{0, 1, 2, defaultStreams},
		{0, 1, 8, defaultStreams},
		{0, 2, 1, defaultStreams},
		{0, 2, 2, 2},
		{0, 4, 2, 1},
		{0, 2, 4, 1},
		{0, 8, 64, 1},
		{3, 8, 64, 3},
		{16, 1, 2, 16},
	} {
		if got := streamsAsked(localInfo{hostID: "h", streams: tc.named}, tc.hostRanks, tc.hosts); got != tc.want {
			t.Errorf("named %d, %d ranks on the host, %d hosts: %d streams; want %d", tc.named, tc.hostRanks, tc.hosts, got, tc.want)
		}
	}
}

// TestStreamsByHost: with no number named, ranks on different hosts get
// the fewer streams of the two ends' shares (streamsAsked); the
// collectives stay right on them.
func TestStreamsByHost(t *testing.T) {
	for _, tc := range []struct {
		hosts []int
		opts  TCPOptions
		want  [][]int // lanes from rank r to each peer; 1 on the same host
	}{
		{[]int{0, 1}, TCPOptions{}, [][]int{{0, 4}, {4, 0}}},
		{[]int{0, 0, 1, 1}, TCPOptions{}, [][]int{{0, 1, 2, 2}, {1, 0, 2, 2}, {2, 2, 0, 1}, {2, 2, 1, 0}}},
		{[]int{0, 0, 0, 1}, TCPOptions{}, [][]int{{0, 1, 1, 1}, {1, 0, 1, 1}, {1, 1, 0, 1}, {1, 1, 1, 0}}},
		{[]int{0, 0, 1, 1, 2, 2}, TCPOptions{}, [][]int{{0, 1, 1, 1, 1, 1}, {1, 0, 1, 1, 1, 1}, {1, 1, 0, 1, 1, 1}, {1, 1, 1, 0, 1, 1}, {1, 1, 1, 1, 0, 1}, {1, 1, 1, 1, 1, 0}}},
		{[]int{0, 0}, TCPOptions{TCPOnly: true}, [][]int{{0, 4}, {4, 0}}},
		{[]int{0, 0, 1, 1}, TCPOptions{Streams: 3}, [][]int{{0, 1, 3, 3}, {1, 0, 3, 3}, {3, 3, 0, 1}, {3, 3, 1, 0}}},
	} {
		t.Run(fmt.Sprint(tc.hosts, tc.opts.TCPOnly, tc.opts.Streams), func(t *testing.T) {
			comms := hostsWorld(t, tc.hosts, tc.opts)
			checkReductions(t, comms, Float32, Sum, 3<<18, 21)
			for r, c := range comms {
				for p, want := range tc.want[r] {
					if got := c.(*comm).t.peers[p].lanes; p != r && got != want {
						t.Errorf("rank %d: %d lanes to rank %d; want %d", r, got, p, want)
					}
				}
			}
		})
	}
}

// A bad number of streams fails NewTCP, saying what was wrong.
func TestBadStreamsOption(t *testing.T) {
	store := rendezvous.NewMemoryStore(time.Second)
	c, err := NewTCP(context.Background(), store, 0, 1, TCPOptions{Host: "127.0.0.1", Streams: -3})
	if err == nil {
		c.Close()
		t.Fatal("NewTCP accepted Streams: -3")
	}
	if !strings.Contains(err.Error(), "-3 TCP streams per peer: want 1 to 16") {
		t.Fatalf("got %v", err)
	}
}

// TestStreamsPerPeer: over TCP each pair of ranks talks over as many
// connections each way as the fewer of its two ends asks for, and large
// messages move bytes on every one of them (the kernel's own count), with
// every collective still right.
func TestStreamsPerPeer(t *testing.T) {
	asked := []int{4, 2, 3}
	comms := testWorldOf(t, len(asked), func(r int) TCPOptions {
		return TCPOptions{TCPOnly: true, Streams: asked[r]}
	})
	// 1 MiB per rank and peer in an all_to_all: four segments each.
	checkMovement(t, comms, Float32, 3<<18, 11)
	checkReductions(t, comms, Float32, Sum, 3<<18, 12)
	for r, c := range comms {
		tr := c.(*comm).t
		for p := range comms {
			if p == r {
				continue
			}
			want := min(asked[r], asked[p])
			if got := tr.peers[p].lanes; got != want {
				t.Errorf("rank %d: %d lanes with rank %d; want %d", r, got, p, want)
			}
			for lane := range maxStreams {
				ic := tr.incoming(p, lane)
				switch {
				case lane >= want && ic != nil:
					t.Errorf("rank %d: a connection from rank %d on lane %d of %d", r, p, lane, want)
				case lane < want && ic == nil:
					t.Errorf("rank %d: no connection from rank %d on lane %d of %d", r, p, lane, want)
				case ic != nil:
					info, err := unix.GetsockoptTCPInfo(ic.fd, unix.IPPROTO_TCP, unix.TCP_INFO)
					if err != nil {
						t.Fatal(err)
					}
					if info.Bytes_received < 256<<10 {
						t.Errorf("rank %d: lane %d from rank %d carried %d bytes; want a segment at least", r, lane, p, info.Bytes_received)
					}
				}
			}
		}
	}
}

// Ranks on one host talk over one Unix socket each way, whatever they ask.
func TestOneStreamOnOneHost(t *testing.T) {
	comms := testWorld(t, 2, TCPOptions{Transport: "unix", Streams: 8})
	checkMovement(t, comms, Float32, 1<<18, 13)
	for r, c := range comms {
		tr := c.(*comm).t
		if got := tr.peers[1-r].lanes; got != 1 {
			t.Errorf("rank %d: %d lanes; want 1", r, got)
		}
		if tr.incoming(1-r, 1) != nil {
			t.Errorf("rank %d: a second connection from its peer", r)
		}
	}
}

// A hello naming a lane out of range, or one already connected, is
// refused: the connection is closed, and the ranks go on.
func TestBadLaneHelloRefused(t *testing.T) {
	comms := testWorld(t, 2, TCPOptions{TCPOnly: true, Streams: 2})
	checkMovement(t, comms, Float32, 1<<18, 14) // both lanes connected
	for _, lane := range []int{maxStreams, -1, 0, 1} {
		c, err := net.Dial("tcp", comms[1].(*comm).t.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		var b [headerSize]byte
		h := header{kind: kindHello, root: 0, count: 2, tag: int32(lane)}
		h.encode(&b)
		if _, err := c.Write(b[:]); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
			t.Errorf("hello on lane %d: read %d bytes, %v; want the connection closed", lane, n, err)
		}
		c.Close()
	}
	checkMovement(t, comms, Float32, 1<<18, 15)
}
