package launcher

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A tree launch, as Open MPI's routed launch: the head reaches at most
// FanOut hosts, and each of those runs a relay (gorun --ssh-relay) that
// starts its own host's agent and launches its share of the other hosts
// the same way. The head and every relay then hold at most FanOut
// connections, and n hosts are reached in about log_FanOut(n) steps.
//
// The head passes each relay a RelayPlan on stdin, after which stdin stays
// open, as for an agent: EOF (the head, or the relay above, is gone or
// stops the job) stops the relay's subtree, and a relay stopped by signal
// stops its subtree as the head stops its hosts, by EOF and SIGTERM.

// treeShares splits n hosts, for a launcher that reaches at most fanOut
// hosts itself: it reaches hosts 0 to len(shares)-1, and host i launches
// the hosts shares[i] in turn. The shares are consecutive runs of the
// other hosts, as even as can be. Host 0 is reached directly and, when
// others are, launches none: at the head it hosts the store that every
// agent waits for, and a relay starts its own agent only once it has
// dialed its share (a share on host 0 delayed the store by seconds at 64
// hosts).
func treeShares(n, fanOut int) [][]int {
	direct := min(n, max(fanOut, 1))
	shares := make([][]int, direct)
	relays := shares
	if direct > 1 {
		relays = shares[1:]
	}
	rest := n - direct
	next := direct
	for i := range relays {
		size := rest / len(relays)
		if i < rest%len(relays) {
			size++
		}
		for range size {
			relays[i] = append(relays[i], next)
			next++
		}
	}
	return shares
}

// RelayPlan is what a relay receives on stdin, as one line of JSON: its
// own host's agent, the hosts it launches, and how.
type RelayPlan struct {
	Self  RemoteAgent   `json:"-"`
	Hosts []RemoteAgent `json:"-"`
	// Relay is the command line of a relay, for the relay's own share.
	Relay        []string      `json:"relay"`
	Dir          string        `json:"dir,omitempty"`
	SSH          RelaySSH      `json:"ssh"`
	FanOut       int           `json:"fan_out"`
	Retries      int           `json:"retries,omitempty"`
	StopTimeout  time.Duration `json:"stop_timeout,omitempty"`
	FailureGrace time.Duration `json:"failure_grace,omitempty"`
	// Stage: the relay copies its own executable to its share's hosts
	// that lack it, at StageTo or in their cache folder.
	Stage   bool   `json:"stage,omitempty"`
	StageTo string `json:"stage_to,omitempty"`
	// LogLevel is the relay's own logger's (zerolog's names).
	LogLevel string `json:"log_level,omitempty"`
	// EventMarker is Fanout.EventMarker.
	EventMarker string `json:"event_marker,omitempty"`
}

// RelaySSH is the part of SSHConfig that a relay takes from the head:
// the files are the same paths on every host.
type RelaySSH struct {
	User           string        `json:"user,omitempty"`
	Port           int           `json:"port,omitempty"`
	IdentityFiles  []string      `json:"identity_files,omitempty"`
	ConfigFile     string        `json:"config_file,omitempty"`
	KnownHosts     string        `json:"known_hosts,omitempty"`
	AcceptNew      bool          `json:"accept_new,omitempty"`
	AgentSocket    string        `json:"agent_socket,omitempty"`
	ConnectTimeout time.Duration `json:"connect_timeout,omitempty"`
}

// relayPlan is the plan of the relay on self's host for share.
func (f *Fanout) relayPlan(self RemoteAgent, share []RemoteAgent) *RelayPlan {
	level := ""
	if l := f.Logger.GetLevel(); l <= 0 {
		level = l.String() // debug and trace travel; others show warnings
	}
	return &RelayPlan{
		Self: self, Hosts: share, Relay: f.Relay, Dir: f.Dir,
		SSH: RelaySSH{
			User: f.SSH.User, Port: f.SSH.Port, IdentityFiles: f.SSH.IdentityFiles,
			ConfigFile: f.SSH.ConfigFile, KnownHosts: f.SSH.KnownHosts, AcceptNew: f.SSH.AcceptNew,
			AgentSocket: f.SSH.AgentSocket, ConnectTimeout: f.SSH.ConnectTimeout,
		},
		FanOut: f.fanOut(), Retries: f.Retries,
		StopTimeout: f.StopTimeout, FailureGrace: f.FailureGrace,
		Stage: f.Stage != nil, StageTo: f.StageTo,
		LogLevel: level,
	}
}

// SSHConfig is the relay's SSHConfig.
func (p *RelayPlan) SSHConfig() SSHConfig {
	s := p.SSH
	return SSHConfig{
		User: s.User, Port: s.Port, IdentityFiles: s.IdentityFiles, ConfigFile: s.ConfigFile,
		KnownHosts: s.KnownHosts, AcceptNew: s.AcceptNew, AgentSocket: s.AgentSocket, ConnectTimeout: s.ConnectTimeout,
	}
}

// Fanout is the relay's launch: its own agent beside its share, with the
// head's settings; the caller adds the streams, signals and logger, and
// Stage when p.Stage.
func (p *RelayPlan) Fanout() Fanout {
	self := p.Self
	return Fanout{
		Agents: p.Hosts, Self: &self, Relay: p.Relay, Dir: p.Dir, SSH: p.SSHConfig(),
		FanOut: p.FanOut, Retries: p.Retries,
		StopTimeout: p.StopTimeout, FailureGrace: p.FailureGrace, StageTo: p.StageTo,
		EventMarker: p.EventMarker,
	}
}

// The plan's hosts differ from one another in a few arguments (the node
// rank, slots) and share the rest, the list of all hosts among them, so
// that writing each argv whole would make the head send O(n²) bytes. A
// host is written as its differences from the relay's own agent.
type relayPlanJSON struct {
	*RelayPlan
	Self  RemoteAgent `json:"self"`
	Hosts []relayHost `json:"hosts"`
}

type relayHost struct {
	Host string `json:"host"`
	// Args replace the self agent's arguments at their index...
	Args map[int]string `json:"args,omitempty"`
	// ...unless Argv has a length of its own.
	Argv []string `json:"argv,omitempty"`
	// Env and Stdin are the self agent's unless Own says otherwise.
	Env      []string `json:"env,omitempty"`
	OwnEnv   bool     `json:"own_env,omitempty"`
	Stdin    []byte   `json:"stdin,omitempty"`
	OwnStdin bool     `json:"own_stdin,omitempty"`
}

// encode writes p as one line of JSON.
func (p *RelayPlan) encode() ([]byte, error) {
	j := relayPlanJSON{RelayPlan: p, Self: p.Self, Hosts: make([]relayHost, len(p.Hosts))}
	base := p.Self
	for i, a := range p.Hosts {
		h := relayHost{Host: a.Host}
		if len(a.Argv) == len(base.Argv) {
			for k, arg := range a.Argv {
				if arg != base.Argv[k] {
					if h.Args == nil {
						h.Args = map[int]string{}
					}
					h.Args[k] = arg
				}
			}
		} else {
			h.Argv = a.Argv
		}
		if !slices.Equal(a.Env, base.Env) {
			h.Env, h.OwnEnv = a.Env, true
		}
		if !slices.Equal(a.Stdin, base.Stdin) {
			h.Stdin, h.OwnStdin = a.Stdin, true
		}
		j.Hosts[i] = h
	}
	b, err := json.Marshal(j)
	if err != nil {
		return nil, fmt.Errorf("launcher: relay plan: %w", err)
	}
	return append(b, '\n'), nil
}

// ReadRelayPlan reads a relay's plan, the first line of r; the rest of r
// is the relay's stdin, which ends when the launcher above is gone.
func ReadRelayPlan(r *bufio.Reader) (*RelayPlan, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("launcher: read the relay plan: %w", err)
	}
	return decodeRelayPlan(line)
}

func decodeRelayPlan(line []byte) (*RelayPlan, error) {
	p := &RelayPlan{}
	j := relayPlanJSON{RelayPlan: p}
	if err := json.Unmarshal(line, &j); err != nil {
		return nil, fmt.Errorf("launcher: relay plan: %w", err)
	}
	p.Self = j.Self
	if len(p.Self.Argv) == 0 {
		return nil, fmt.Errorf("launcher: relay plan: no agent for this host")
	}
	p.Hosts = make([]RemoteAgent, len(j.Hosts))
	for i, h := range j.Hosts {
		a := RemoteAgent{Host: h.Host, Argv: h.Argv, Env: p.Self.Env, Stdin: p.Self.Stdin}
		if a.Argv == nil {
			a.Argv = slices.Clone(p.Self.Argv)
			for k, arg := range h.Args {
				if k < 0 || k >= len(a.Argv) {
					return nil, fmt.Errorf("launcher: relay plan: host %s: argument %d of %d", h.Host, k, len(a.Argv))
				}
				a.Argv[k] = arg
			}
		}
		if h.OwnEnv {
			a.Env = h.Env
		}
		if h.OwnStdin {
			a.Stdin = h.Stdin
		}
		p.Hosts[i] = a
	}
	return p, nil
}

// relayEventPrefix starts a relay's event marker, which a nonce of its
// launcher's completes: a worker's line cannot know it.
const relayEventPrefix = "gorun-relay-event-"

// relayEvent is a relay's word that its subtree's status changed (to
// code) or that it lost a host.
type relayEvent struct {
	i    int // the relay's index in the launcher's list
	code int
	lost bool
}

// parseRelayEvent reads what follows the marker: "failed CODE" or "lost".
func parseRelayEvent(word []byte) (relayEvent, bool) {
	f := strings.Fields(string(word))
	switch {
	case len(f) == 1 && f[0] == "lost":
		return relayEvent{lost: true}, true
	case len(f) == 2 && f[0] == "failed":
		code, err := strconv.Atoi(f[1])
		return relayEvent{code: code}, err == nil && code > 0
	}
	return relayEvent{}, false
}

// relayEvents passes one relay's stderr on to w, except the lines that
// start with the relay's marker, which it hands to the launcher's loop as
// events (until done is closed).
type relayEvents struct {
	w      io.Writer
	marker []byte
	i      int
	events chan<- relayEvent
	done   <-chan struct{}
	lines  lineBuffer
}

func (r *relayEvents) Write(p []byte) (int, error) {
	var out []byte
	r.lines.feed(p, func(line []byte, whole bool) {
		word, ok := bytes.CutPrefix(line, r.marker)
		ev, valid := parseRelayEvent(word)
		if !whole || !ok || !valid {
			out = append(out, line...)
			return
		}
		ev.i = r.i
		select {
		case r.events <- ev:
		case <-r.done:
		}
	})
	if len(out) > 0 {
		if _, err := r.w.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}
