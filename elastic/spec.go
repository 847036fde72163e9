// Package elastic is the per-node agent: it decides WHEN workers start. It
// runs the rendezvous, assigns ranks, starts the worker group through the
// launcher, watches it, restarts it within the restart budget, and reports
// failures with the root cause first.
package elastic

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
)

// Spec is everything the agent needs to run one job on this node. The CLI
// fills it from torchrun's flags.
type Spec struct {
	// Argv is the worker command line (see launcher.Argv).
	Argv []string
	// Python reports whether the program is a Python script or module.
	Python bool
	// Name is the program as reports name it: the script or module, not
	// the interpreter (default Argv[0]).
	Name string

	NProcPerNode int
	MinNodes     int
	MaxNodes     int
	NodeRank     int
	Role         string
	RunID        string

	// Backend is the rendezvous: "static", "c10d" (dynamic) or "etcd".
	Backend string
	// Dynamic configures the c10d rendezvous, and the timings of etcd's.
	Dynamic DynamicSpec
	// Etcd says where the etcd rendezvous's cluster is.
	Etcd EtcdSpec

	// MasterAddr and MasterPort name the store of the static rendezvous.
	// MasterPort 0 on a single node means: host it on an ephemeral port.
	MasterAddr string
	MasterPort int
	// LocalAddr is the address this node advertises to workers and peers.
	LocalAddr string
	// NodeHosts names the job's nodes in node-rank order, when the
	// launcher knows them (a Slurm step): a node waiting for the others
	// names those missing by host.
	NodeHosts []string
	// ShareStore gives workers the agent's store (TORCHELASTIC_USE_AGENT_STORE);
	// otherwise worker rank 0 hosts its own on a port the agent chose.
	ShareStore bool
	// StoreTimeout bounds waits on the rendezvous store.
	StoreTimeout time.Duration
	// ExitBarrierTimeout bounds how long a node whose workers finished
	// waits for the others (dynamic rendezvous).
	ExitBarrierTimeout time.Duration

	MaxRestarts int
	// MonitorInterval is torchrun's polling period, accepted for
	// compatibility: the agent sees every exit as it happens.
	MonitorInterval  time.Duration
	ShutdownTimeout  time.Duration
	Signals          []syscall.Signal
	VirtualLocalRank bool
	// CPUs lists, per worker of this node, the CPUs it is bound to
	// (launcher.Binding.CPUsFor); nil leaves every worker unbound.
	CPUs [][]int
	// Placement, when set, is where this node's one worker sits in the
	// job as its workers see it (LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
	// GROUP_WORLD_SIZE), rather than where the rendezvous puts it: under
	// `srun gorun --slurm-direct` each Slurm task is a "node" of one worker
	// for the rendezvous, but Slurm decides its local rank and node.
	Placement *Placement
	// HangTimeout, when positive, restarts (or fails) a worker group in
	// which a worker that uses the runtime made no progress for that long:
	// see hang.go. Zero is off.
	HangTimeout time.Duration
	// FileTimer serves torch's file-timer watchdog
	// (TORCHELASTIC_ENABLE_FILE_TIMER=1): workers acquire scopes with
	// torch.distributed.elastic.timer.expires through a named pipe, and
	// one that overstays a scope is killed. See filetimer.go.
	FileTimer bool
	// TimerFile is the watchdog's named pipe (TORCHELASTIC_TIMER_FILE);
	// empty puts it in the agent's log folder.
	TimerFile string

	// LogDir receives <run_id>/attempt_<k>/<local_rank>/{stdout,stderr}.log;
	// empty means a temporary folder that holds only the error files.
	LogDir string
	// MetricsAddr, when set, is the HOST:PORT the agent serves its
	// Prometheus metrics on (/metrics).
	MetricsAddr string
	// Report, when set, is where gorun writes the job's timeline when it
	// ends (.html or .svg); gorun's main writes it, not the agent.
	Report string
	// Redirects and Tee say, per local rank, which streams go to files only
	// and which go to files and the console.
	Redirects map[int]launcher.Std
	Tee       map[int]launcher.Std
	// ConsoleRanks limits the console to these local ranks; nil shows all.
	ConsoleRanks map[int]bool
	// PrefixTemplate formats each console line's prefix (launcher.FormatPrefix);
	// empty means none.
	PrefixTemplate string
	// DuplicateStdout and DuplicateStderr copy the tee'd lines that contain
	// any of them into the attempt's filtered_stdout.log or
	// filtered_stderr.log, as torchrun's --duplicate-*-filters.
	DuplicateStdout, DuplicateStderr []string
	// EventLog prints torchelastic's events as JSON lines on stderr
	// (--event-log-handler console).
	EventLog   bool
	Timestamps bool
	// PTY gives workers a pseudo-terminal for stdout.
	PTY bool
	// Dir is the workers' working directory ("" = the agent's).
	Dir string
	// Env is the environment workers inherit.
	Env []string
	// Host names this node in reports.
	Host string
}

// Placement is a worker's place as Slurm (or another scheduler) decided it.
type Placement struct {
	LocalRank, LocalWorldSize int
	NodeRank, NNodes          int
}

// DynamicSpec configures the c10d (dynamic) rendezvous: where its store is
// and how rounds and heartbeats are timed (--rdzv-endpoint, --rdzv-conf).
type DynamicSpec struct {
	Host string
	Port int
	// IsHost forces hosting the store (true) or joining it (false); nil
	// infers it from the endpoint.
	IsHost                                     *bool
	JoinTimeout, LastCallTimeout, CloseTimeout time.Duration
	HeartbeatInterval                          time.Duration
	HeartbeatMisses                            int
	// HeartbeatTimeout bounds each heartbeat (torch's heartbeat_timeout);
	// zero leaves it to ReadTimeout.
	HeartbeatTimeout time.Duration
	// ReadTimeout bounds connecting to the store.
	ReadTimeout time.Duration
	// FailureGrace is how long a worker failure waits for news of a lost
	// node before it spends a restart.
	FailureGrace time.Duration
	// TokenFile names the file of the job's rendezvous secret
	// (--rdzv-conf token_file).
	TokenFile string
	// Auth is the job's rendezvous secret, shared by its agents; nil
	// leaves the store open, as torch's.
	Auth *rendezvous.Auth
}

// EtcdSpec is the etcd cluster of --rdzv-backend etcd (--rdzv-endpoint,
// --rdzv-conf protocol, cacert, cert, key, lease_ttl); its timeouts are
// those of DynamicSpec.
type EtcdSpec struct {
	// Endpoints are the members, host:port.
	Endpoints []string
	// TLS speaks HTTPS to them (protocol=https), trusting CACert (empty:
	// the system's CAs), with the client certificate Cert and its Key
	// when the members ask for one.
	TLS               bool
	CACert, Cert, Key string
	// LeaseTTL is how long a node's keys outlive it: how soon the others
	// learn that it died or lost etcd.
	LeaseTTL time.Duration
}

// Validate reports the first inconsistency in s, in the words of the flag
// that causes it.
func (s *Spec) Validate() error {
	var errs []error
	if len(s.Argv) == 0 || s.Argv[0] == "" {
		errs = append(errs, errors.New("no program to run"))
	}
	if s.NProcPerNode < 1 {
		errs = append(errs, fmt.Errorf("--nproc-per-node must be at least 1, got %d", s.NProcPerNode))
	}
	if s.MinNodes < 1 || s.MinNodes > s.MaxNodes {
		errs = append(errs, fmt.Errorf("--nnodes %d:%d: want 0 < min <= max", s.MinNodes, s.MaxNodes))
	}
	if s.NodeRank < -1 || s.NodeRank >= s.MaxNodes {
		errs = append(errs, fmt.Errorf("--node-rank %d is outside 0..%d", s.NodeRank, s.MaxNodes-1))
	}
	if s.MaxRestarts < 0 {
		errs = append(errs, fmt.Errorf("--max-restarts must not be negative, got %d", s.MaxRestarts))
	}
	if s.MasterPort < 0 || s.MasterPort > 65535 {
		errs = append(errs, fmt.Errorf("--master-port %d is not a TCP port", s.MasterPort))
	}
	if s.Backend == "static" && s.MaxNodes > 1 && s.MasterPort == 0 {
		errs = append(errs, errors.New("--master-port is required with more than one node"))
	}
	if s.Backend == "static" && s.MinNodes != s.MaxNodes {
		errs = append(errs, fmt.Errorf("--nnodes %d:%d: a range needs --rdzv-backend c10d", s.MinNodes, s.MaxNodes))
	}
	if s.Placement != nil && s.NProcPerNode != 1 {
		errs = append(errs, fmt.Errorf("a placed worker is one per node: --nproc-per-node must be 1, got %d", s.NProcPerNode))
	}
	if s.HangTimeout < 0 {
		errs = append(errs, fmt.Errorf("--hang-timeout must not be negative, got %s", s.HangTimeout))
	}
	if s.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout must not be negative, got %s", s.ShutdownTimeout))
	}
	if err := ValidateName("--rdzv-id", s.RunID); err != nil {
		errs = append(errs, err)
	}
	if err := ValidateName("--role", s.Role); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
