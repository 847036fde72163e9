package main

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
)

// fakeFlags is a command line as resolve reads it: the flags' defaults,
// with set overriding them.
type fakeFlags struct {
	defaults map[string]string
	set      map[string]string
}

func newFakeFlags(set map[string]string) fakeFlags {
	f := fakeFlags{defaults: map[string]string{}, set: set}
	for _, fl := range append(flags(), headFlags()...) {
		if s, ok := fl.(namedString); ok {
			f.defaults[s.Name] = s.Value
		}
	}
	return f
}

func (f fakeFlags) String(name string) string {
	if v, ok := f.set[name]; ok {
		return v
	}
	return f.defaults[name]
}
func (f fakeFlags) Bool(name string) bool  { return f.set[name] == "true" }
func (f fakeFlags) IsSet(name string) bool { _, ok := f.set[name]; return ok }
func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// testMachine is a node with 4 CPUs, no GPU, no terminal, no Slurm.
func testMachine(lookupEnv func(string) (string, bool)) machine {
	return machine{
		lookupEnv: lookupEnv,
		environ:   []string{"PATH=/bin"},
		countGPUs: func() (int, error) { return 0, errors.New("no NVML") },
		cpusFor: func(b launcher.Binding, n int) ([][]int, error) {
			per := make([][]int, n)
			for i := range per {
				per[i] = []int{i % 4}
			}
			return per, nil
		},
		hostname: "node-a",
		randomID: func() string { return "rand0m" },
	}
}

// resolveWith resolves set (flag values, "true" for booleans) and the
// program "train.py".
func resolveWith(t *testing.T, set map[string]string, lookupEnv func(string) (string, bool)) (resolution, error) {
	t.Helper()
	if lookupEnv == nil {
		lookupEnv = env()
	}
	return resolve(newFakeFlags(set), []string{"train.py", "--lr", "0.1"}, testMachine(lookupEnv))
}

// resolveCase is a command line and what resolve must make of it.
type resolveCase struct {
	name string
	set  map[string]string
	env  func(string) (string, bool)
	// want checks the spec; wantErr is part of the error.
	want    func(elastic.Spec) bool
	wantErr string
}

func (tc resolveCase) check(t *testing.T) {
	t.Helper()
	res, err := resolveWith(t, tc.set, tc.env)
	switch {
	case tc.wantErr != "":
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Fatalf("error %v; want one naming %q", err, tc.wantErr)
		}
	case err != nil:
		t.Fatalf("error %v", err)
	case !tc.want(res.spec):
		t.Errorf("spec not as wanted: %+v", res.spec)
	}
}

func TestResolveRendezvous(t *testing.T) {
	for _, tc := range []resolveCase{
		{name: "one node: static on an ephemeral port", set: nil,
			want: func(s elastic.Spec) bool { return s.Backend == "static" && s.MasterPort == 0 && s.NodeRank == 0 }},
		{name: "static endpoint names the store, as torchrun's",
			set: map[string]string{"nnodes": "1", "rdzv-id": "101", "rdzv-endpoint": "localhost:5972"},
			want: func(s elastic.Spec) bool {
				return s.Backend == "static" && s.MasterAddr == "localhost" && s.MasterPort == 5972 && s.RunID == "101"
			}},
		{name: "static endpoint without a port keeps --master-port",
			set:  map[string]string{"rdzv-endpoint": "node0", "master-port": "1234"},
			want: func(s elastic.Spec) bool { return s.MasterAddr == "node0" && s.MasterPort == 1234 }},
		{name: "a range of nodes is c10d",
			set: map[string]string{"nnodes": "1:3", "rdzv-endpoint": "node0"},
			want: func(s elastic.Spec) bool {
				return s.Backend == "c10d" && s.Dynamic.Host == "node0" && s.Dynamic.Port == 29400 && s.NodeRank == -1
			}},
		{name: "etcd-v2 is torch's spelling of etcd; members on etcd's port by default",
			set: map[string]string{"rdzv-backend": "etcd-v2", "rdzv-id": "j1", "nnodes": "2:4", "rdzv-endpoint": "e1,e2:2380,[::1]:3000"},
			want: func(s elastic.Spec) bool {
				e, d := s.Etcd, s.Dynamic
				return s.Backend == "etcd" && slices.Equal(e.Endpoints, []string{"e1:2379", "e2:2380", "[::1]:3000"}) &&
					!e.TLS && e.LeaseTTL == 10*time.Second && d.FailureGrace == 20*time.Second &&
					d.JoinTimeout == rendezvous.DefaultJoinTimeout && d.ReadTimeout == 60*time.Second && s.NodeRank == -1
			}},
		{name: "etcd: torch's TLS keys, timeout as the join timeout, a lease TTL",
			set: map[string]string{"rdzv-backend": "etcd", "rdzv-id": "j1", "rdzv-endpoint": "e1",
				"rdzv-conf": "protocol=https,cacert=ca.pem,cert=c.pem,key=k.pem,timeout=30,last_call_timeout=2,read_timeout=5,lease_ttl=3"},
			want: func(s elastic.Spec) bool {
				e, d := s.Etcd, s.Dynamic
				return e.TLS && e.CACert == "ca.pem" && e.Cert == "c.pem" && e.Key == "k.pem" && e.LeaseTTL == 3*time.Second &&
					d.JoinTimeout == 30*time.Second && d.LastCallTimeout == 2*time.Second && d.ReadTimeout == 5*time.Second &&
					d.FailureGrace == 6*time.Second
			}},
		{name: "etcd: torch's ttl is the lease TTL",
			set: map[string]string{"rdzv-backend": "etcd", "rdzv-id": "j1", "rdzv-conf": "ttl=4,join_timeout=9"},
			want: func(s elastic.Spec) bool {
				return s.Etcd.LeaseTTL == 4*time.Second && s.Dynamic.JoinTimeout == 9*time.Second
			}},
		{name: "etcd: a protocol other than http or https",
			set: map[string]string{"rdzv-backend": "etcd", "rdzv-conf": "protocol=grpc"}, wantErr: `protocol="grpc"`},
		{name: "etcd: a certificate without its key",
			set: map[string]string{"rdzv-backend": "etcd", "rdzv-conf": "protocol=https,cert=c.pem"}, wantErr: "cert and key"},
		{name: "etcd: certificates over plain http",
			set: map[string]string{"rdzv-backend": "etcd", "rdzv-conf": "cacert=ca.pem"}, wantErr: "protocol=https"},
		{name: "etcd: a lease shorter than etcd counts",
			set: map[string]string{"rdzv-backend": "etcd", "rdzv-conf": "lease_ttl=0.5"}, wantErr: "lease_ttl"},
		{name: "etcd: a bad member",
			set: map[string]string{"rdzv-backend": "etcd", "rdzv-endpoint": "e1:2379,e2:x"}, wantErr: `--rdzv-endpoint "e2:x"`},
		{name: "etcd: a job's own id",
			set: map[string]string{"rdzv-backend": "etcd"}, wantErr: "needs a --rdzv-id"},
		{name: "the head names the hosts",
			set:  map[string]string{"rdzv-backend": "c10d", "nnodes": "2", "node-hosts": "a,b"},
			want: func(s elastic.Spec) bool { return slices.Equal(s.NodeHosts, []string{"a", "b"}) }},
		{name: "a backend gorun lacks",
			set: map[string]string{"rdzv-backend": "zookeeper"}, wantErr: "want static, c10d or etcd"},
		{name: "torch's keep-alive names are the heartbeats",
			set: map[string]string{"rdzv-backend": "c10d", "rdzv-conf": "keep_alive_interval=2,keep_alive_max_attempt=4,heartbeat_timeout=1.5"},
			want: func(s elastic.Spec) bool {
				d := s.Dynamic
				return d.HeartbeatInterval == 2*time.Second && d.HeartbeatMisses == 4 && d.HeartbeatTimeout == 1500*time.Millisecond &&
					d.FailureGrace == 10*time.Second
			}},
		{name: "a setting given twice under two names must agree",
			set:     map[string]string{"rdzv-backend": "c10d", "rdzv-conf": "keep_alive_interval=2,heartbeat_interval=3"},
			wantErr: "the same setting, two values"},
		{name: "c10d timeouts and store type",
			set: map[string]string{"rdzv-backend": "c10d", "rdzv-conf": "join_timeout=5,last_call_timeout=0.5,close_timeout=2,read_timeout=7,is_host=false,store_type=tcp,use_libuv=1"},
			want: func(s elastic.Spec) bool {
				d := s.Dynamic
				return d.JoinTimeout == 5*time.Second && d.LastCallTimeout == 500*time.Millisecond && d.CloseTimeout == 2*time.Second &&
					d.ReadTimeout == 7*time.Second && d.IsHost != nil && !*d.IsHost
			}},
		{name: "a file store is not ours",
			set: map[string]string{"rdzv-backend": "c10d", "rdzv-conf": "store_type=file"}, wantErr: `store_type="file"`},
		{name: "static timeout and rank",
			set:  map[string]string{"nnodes": "2", "master-port": "1234", "rdzv-conf": "timeout=30,rank=1"},
			want: func(s elastic.Spec) bool { return s.StoreTimeout == 30*time.Second && s.NodeRank == 1 }},
		{name: "static rank against --node-rank",
			set:     map[string]string{"nnodes": "2", "master-port": "1234", "node-rank": "0", "rdzv-conf": "rank=1"},
			wantErr: "--rdzv-conf rank=1"},
		{name: "bad seconds", set: map[string]string{"rdzv-conf": "timeout=soon"}, wantErr: `--rdzv-conf timeout "soon"`},
		{name: "standalone gets a random run id",
			set:  map[string]string{"standalone": "true", "nnodes": "2", "rdzv-endpoint": "x:1"},
			want: func(s elastic.Spec) bool { return s.Backend == "static" && s.MaxNodes == 1 && s.RunID == "rand0m" }},
		{name: "inside an srun step, Slurm decides",
			env: env("SLURM_JOB_ID", "42", "SLURM_STEP_ID", "0", "SLURM_NNODES", "2", "SLURM_NODEID", "1",
				"SLURM_JOB_NODELIST", "n[1-2]", "SLURM_STEP_NODELIST", "n[1-2]"),
			want: func(s elastic.Spec) bool {
				return s.Backend == "c10d" && s.MinNodes == 2 && s.NodeRank == 1 && s.RunID == "slurm-42" &&
					s.Dynamic.Host == "n1" && s.Dynamic.Port == 29442 && slices.Contains(s.Signals, 10) &&
					slices.Equal(s.NodeHosts, []string{"n1", "n2"})
			}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.check(t) })
	}
}

// Keys of another backend, and unknown ones, are named in a warning, with
// gorun's own names for the unknown.
func TestResolveNamesUnusedRdzvConf(t *testing.T) {
	res, err := resolveWith(t, map[string]string{"rdzv-conf": "join_timeout=5,keep_alive_interval=1,bogus=1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var warnings []string
	for _, n := range res.notes {
		if n.level == zerolog.WarnLevel {
			warnings = append(warnings, n.msg)
		}
	}
	want := []string{
		"--rdzv-conf bogus is not a rendezvous setting; gorun knows timeout",
		"--rdzv-conf join_timeout has no effect with --rdzv-backend static: it configures c10d",
		"--rdzv-conf keep_alive_interval has no effect with --rdzv-backend static: it configures c10d",
	}
	if len(warnings) != len(want) {
		t.Fatalf("warnings %q; want %d", warnings, len(want))
	}
	for i := range want {
		if !strings.HasPrefix(warnings[i], want[i]) {
			t.Errorf("warning %d: %q; want %q...", i, warnings[i], want[i])
		}
	}
}

func TestResolveOutput(t *testing.T) {
	for _, tc := range []resolveCase{
		{name: "default prefix", want: func(s elastic.Spec) bool { return s.PrefixTemplate == "[rank${rank}]: " }},
		{name: "an empty template turns the prefix off",
			set: map[string]string{"log-line-prefix-template": ""}, want: func(s elastic.Spec) bool { return s.PrefixTemplate == "" }},
		{name: "so does an empty one in the environment",
			env: env("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", ""), want: func(s elastic.Spec) bool { return s.PrefixTemplate == "" }},
		{name: "the flag wins over the environment",
			set: map[string]string{"log-line-prefix-template": "${hostname}: "}, env: env("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "x"),
			want: func(s elastic.Spec) bool { return s.PrefixTemplate == "${hostname}: " }},
		{name: "duplicate filters, ,, for a comma",
			set: map[string]string{"duplicate-stdout-filters": "loss,,acc,nan", "duplicate-stderr-filters": "NCCL WARN"},
			want: func(s elastic.Spec) bool {
				return slices.Equal(s.DuplicateStdout, []string{"loss,acc", "nan"}) && slices.Equal(s.DuplicateStderr, []string{"NCCL WARN"})
			}},
		{name: "the default logs specs", set: map[string]string{"logs-specs": "default"}, want: func(elastic.Spec) bool { return true }},
		{name: "a logs specs plugin", set: map[string]string{"logs-specs": "mine"}, wantErr: `--logs-specs "mine"`},
		{name: "torch's file timer", env: env("TORCHELASTIC_ENABLE_FILE_TIMER", "1", "TORCHELASTIC_TIMER_FILE", "/run/t"),
			want: func(s elastic.Spec) bool { return s.FileTimer && s.TimerFile == "/run/t" }},
		{name: "console events", set: map[string]string{"event-log-handler": "console"}, want: func(s elastic.Spec) bool { return s.EventLog }},
		{name: "unknown event handler", set: map[string]string{"event-log-handler": "scuba"}, wantErr: `--event-log-handler "scuba"`},
		{name: "redirects for a rank beyond nproc", set: map[string]string{"nproc-per-node": "2", "redirects": "2:1"}, wantErr: "--redirects"},
		{name: "pty", set: map[string]string{"pty": "sometimes"}, wantErr: `--pty "sometimes"`},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.check(t) })
	}
}

func TestResolveProgram(t *testing.T) {
	for _, tc := range []struct {
		set      map[string]string
		env      func(string) (string, bool)
		argv     []string
		wantArgv []string
		wantName string
	}{
		{nil, nil, []string{"train.py", "--lr", "1"}, []string{"python3", "-u", "train.py", "--lr", "1"}, "train.py"},
		{map[string]string{"module": "true"}, nil, []string{"pkg.train"}, []string{"python3", "-u", "-m", "pkg.train"}, "pkg.train"},
		{map[string]string{"no-python": "true"}, nil, []string{"./w", "x"}, []string{"./w", "x"}, "./w"},
		{map[string]string{"run-path": "true"}, env("PYTHON_EXEC", "/opt/py"), []string{"/abs/t"}, []string{"/opt/py", "-u", "/abs/t"}, "/abs/t"},
		{map[string]string{"python": "py3"}, env("PYTHON_EXEC", "/opt/py"), []string{"t.py"}, []string{"py3", "-u", "t.py"}, "t.py"},
	} {
		lookup := tc.env
		if lookup == nil {
			lookup = env()
		}
		res, err := resolve(newFakeFlags(tc.set), tc.argv, testMachine(lookup))
		if err != nil || !slices.Equal(res.spec.Argv, tc.wantArgv) || res.spec.Name != tc.wantName {
			t.Errorf("%v %v: argv %q name %q, %v; want %q %q", tc.set, tc.argv, res.spec.Argv, res.spec.Name, err, tc.wantArgv, tc.wantName)
		}
	}
	if _, err := resolve(newFakeFlags(map[string]string{"module": "true", "no-python": "true"}), []string{"x"}, testMachine(env())); err == nil ||
		!strings.Contains(err.Error(), "--module and --no-python") {
		t.Errorf("--module --no-python: %v", err)
	}
	if _, err := resolve(newFakeFlags(nil), nil, testMachine(env())); err == nil || !strings.Contains(err.Error(), "no program") {
		t.Errorf("no program: %v", err)
	}
}

func TestResolvePlacement(t *testing.T) {
	var asked []launcher.Binding
	m := testMachine(env())
	m.cpusFor = func(b launcher.Binding, n int) ([][]int, error) {
		asked = append(asked, b)
		return make([][]int, n), nil
	}
	for _, tc := range []struct {
		set     map[string]string
		want    launcher.Binding
		wantErr string
	}{
		{map[string]string{"bind-to": "core"}, launcher.BindCore, ""},
		{map[string]string{"numa-binding": "node"}, launcher.BindGPUNode, ""},
		{map[string]string{"numa-binding": "core-complex"}, launcher.BindGPUCoreComplex, ""},
		{map[string]string{"numa-binding": "rack"}, "", `--numa-binding "rack"`},
		{map[string]string{"numa-binding": "node", "bind-to": "core"}, "", "exclude each other"},
		{nil, "", ""},
	} {
		asked = nil
		_, err := resolve(newFakeFlags(tc.set), []string{"w"}, m)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error %v; want %q", tc.set, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%v: %v", tc.set, err)
		case tc.want == "" && len(asked) != 0, tc.want != "" && !slices.Equal(asked, []launcher.Binding{tc.want}):
			t.Errorf("%v: asked for %v; want %q", tc.set, asked, tc.want)
		}
	}
}

func TestResolveTorchrunOnlyFlags(t *testing.T) {
	res, err := resolveWith(t, map[string]string{"start-method": "fork", "use-env": "true"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.notes) == 0 || !strings.Contains(res.notes[0].msg, "--start-method fork") {
		t.Errorf("notes %v; want one on --start-method", res.notes)
	}
	if _, err := resolveWith(t, map[string]string{"start-method": "thread"}, nil); err == nil || !strings.Contains(err.Error(), `--start-method "thread"`) {
		t.Errorf("--start-method thread: %v", err)
	}
}

// Every error is reported at once, each naming its flag.
func TestResolveGathersEveryError(t *testing.T) {
	_, err := resolveWith(t, map[string]string{"max-restarts": "x", "pty": "y", "bind-to": "z"}, nil)
	for _, want := range []string{`--max-restarts "x"`, `--pty "y"`, `--bind-to "z"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v; want it to name %s", err, want)
		}
	}
	var ue usageError
	if !errors.As(err, &ue) {
		t.Errorf("%T is not a usageError", err)
	}
}

func TestFlagErrorAsTyped(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		args []string
		want string
	}{
		{"flag provided but not defined: -start-methodx", []string{"--start-methodx", "spawn", "w"}, "flag provided but not defined: --start-methodx"},
		{"flag provided but not defined: -bogus", []string{"--bogus=1", "w"}, "flag provided but not defined: --bogus"},
		{"flag provided but not defined: -q", []string{"-q", "w"}, "flag provided but not defined: -q"},
		{"flag needs an argument: -role", []string{"w", "--role"}, "flag needs an argument: --role"},
		{"flag provided but not defined: -z", []string{"--", "--z"}, "flag provided but not defined: -z"},
	} {
		if got := flagErrorAsTyped(errors.New(tc.msg), tc.args); got != tc.want {
			t.Errorf("%q %q: got %q, want %q", tc.msg, tc.args, got, tc.want)
		}
	}
}

// Issue 21: absurd or malformed values are refused, each by name, before
// anything starts.
func TestResolveRejectsAbsurdInput(t *testing.T) {
	for _, tc := range []resolveCase{
		{name: "NaN grace", set: map[string]string{"shutdown-timeout": "NaN"}, wantErr: `--shutdown-timeout "NaN"`},
		{name: "infinite grace", set: map[string]string{"shutdown-timeout": "Inf"}, wantErr: `--shutdown-timeout "Inf"`},
		{name: "a grace that overflows", set: map[string]string{"shutdown-timeout": "1e300"}, wantErr: `--shutdown-timeout "1e300"`},
		{name: "grace from the environment", env: env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "-Inf"), wantErr: `--shutdown-timeout "-Inf"`},
		{name: "containment", env: env("GORUN_CONTAINMENT", "jail"), wantErr: `GORUN_CONTAINMENT="jail"`},
		{name: "a year is the most", set: map[string]string{"shutdown-timeout": "31622400"},
			want: func(s elastic.Spec) bool { return s.ShutdownTimeout == 366*24*time.Hour }},
		{name: "monitor interval 0", set: map[string]string{"monitor-interval": "0"}, wantErr: `--monitor-interval "0"`},
		{name: "monitor interval NaN", set: map[string]string{"monitor-interval": "nan"}, wantErr: `--monitor-interval "nan"`},
		{name: "hang timeout Inf", set: map[string]string{"hang-timeout": "+Inf"}, wantErr: `--hang-timeout "+Inf"`},
		{name: "hang timeout as a duration", set: map[string]string{"hang-timeout": "90s"},
			want: func(s elastic.Spec) bool { return s.HangTimeout == 90*time.Second }},
		{name: "rdzv-conf NaN", set: map[string]string{"rdzv-backend": "c10d", "rdzv-conf": "join_timeout=NaN"}, wantErr: "join_timeout"},
		{name: "endpoint of colons", set: map[string]string{"rdzv-backend": "c10d", "rdzv-endpoint": ":::"}, wantErr: "no host to reach"},
		{name: "unbracketed IPv6", set: map[string]string{"rdzv-endpoint": "fe80::1:29400"}, wantErr: "in brackets"},
		{name: "bracketed IPv6", set: map[string]string{"rdzv-backend": "c10d", "rdzv-endpoint": "[fe80::1]:29401"},
			want: func(s elastic.Spec) bool { return s.Dynamic.Host == "fe80::1" && s.Dynamic.Port == 29401 }},
		{name: "a host of stray characters", set: map[string]string{"rdzv-endpoint": "no de:1"}, wantErr: "not a host name"},
		{name: "an unspecified address", set: map[string]string{"rdzv-endpoint": "0.0.0.0:1"}, wantErr: "no host to reach"},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.check(t) })
	}
}

// Workers beyond what the open-files or process limits allow are refused
// before the first starts.
func TestResolveChecksLimits(t *testing.T) {
	// Without the store's connections, which TestResolveChecksStoreFiles
	// counts.
	m := testMachine(env("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"))
	m.maxFiles, m.maxProcs = 20000, 1000
	for _, tc := range []struct {
		nproc, wantErr string
	}{
		{"100", ""},
		{"3290", ""},
		{"3291", "enough for 3290 workers"},
		{"100000", "ulimit -n"},
	} {
		m := m
		if tc.nproc == "3290" || tc.nproc == "3291" {
			m.maxProcs = 0
		}
		_, err := resolve(newFakeFlags(map[string]string{"nproc-per-node": tc.nproc}), []string{"w"}, m)
		if (tc.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("--nproc-per-node %s: %v; want %q", tc.nproc, err, tc.wantErr)
		}
	}
	m.maxFiles = 0
	if _, err := resolve(newFakeFlags(map[string]string{"nproc-per-node": "1000"}), []string{"w"}, m); err == nil || !strings.Contains(err.Error(), "ulimit -u") {
		t.Errorf("1000 workers of 1000 processes: %v", err)
	}
}

// A node that may host the workers' store must be able to hold a
// connection from every rank: an error (exit 71) before anything starts
// when even the fewest nodes cannot, a warning when the most cannot.
func TestResolveChecksStoreFiles(t *testing.T) {
	const files = 20000 // reserve: the store's 1024 and gorun's 256
	for _, tc := range []struct {
		name    string
		set     map[string]string
		env     []string
		files   uint64 // 0: 20000
		wantErr bool
		warn    string // in a warning note, if not empty
	}{
		{name: "standalone", set: map[string]string{"standalone": "true", "nproc-per-node": "8"}},
		// 2048*8 + 2048 agents + 1024 + 8*6 + 256 = 19760 files.
		{name: "the most that fit", set: map[string]string{"nnodes": "2048", "nproc-per-node": "8", "node-rank": "0", "master-addr": "n0", "master-port": "29500"}},
		{name: "one node too many", set: map[string]string{"nnodes": "2100", "nproc-per-node": "8", "node-rank": "0", "master-addr": "n0", "master-port": "29500"}, wantErr: true},
		{name: "static, another node hosts", set: map[string]string{"nnodes": "4096", "nproc-per-node": "8", "node-rank": "1", "master-addr": "n0", "master-port": "29500"}},
		{name: "c10d, any node may host", set: map[string]string{"nnodes": "4096", "nproc-per-node": "8", "rdzv-backend": "c10d", "rdzv-endpoint": "n0:29400"}, wantErr: true},
		{name: "c10d, the most cannot fit", set: map[string]string{"nnodes": "1:4096", "nproc-per-node": "8", "rdzv-endpoint": "n0:29400"},
			warn: "4096 nodes of 8 workers need about 38192 open files"},
		{name: "c10d, a node ranked 2", set: map[string]string{"nnodes": "4096", "nproc-per-node": "8", "rdzv-backend": "c10d", "rdzv-endpoint": "n0:29400", "node-rank": "2"}},
		{name: "workers host their own store", set: map[string]string{"nnodes": "4096", "nproc-per-node": "8", "node-rank": "0", "master-addr": "n0", "master-port": "29500"},
			env: []string{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"}},
		{name: "a large limit", set: map[string]string{"nnodes": "4096", "nproc-per-node": "8", "node-rank": "0", "master-addr": "n0", "master-port": "29500"}, files: 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testMachine(env(tc.env...))
			m.maxFiles = cmp.Or(tc.files, files)
			res, err := resolve(newFakeFlags(tc.set), []string{"w"}, m)
			if tc.wantErr {
				var ue usageError
				if !errors.Is(err, syscall.EMFILE) || errors.As(err, &ue) || failureStatus(err) != exitResources || !strings.Contains(err.Error(), "ulimit -n") {
					t.Fatalf("err %v (status %d); want one of resources (exit 71) naming ulimit -n", err, failureStatus(err))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var warned []string
			for _, n := range res.notes {
				if n.level == zerolog.WarnLevel && strings.Contains(n.msg, "open files") {
					warned = append(warned, n.msg)
				}
			}
			switch {
			case tc.warn == "" && len(warned) > 0:
				t.Errorf("warned %q; want no warning", warned)
			case tc.warn != "" && (len(warned) != 1 || !strings.Contains(warned[0], tc.warn)):
				t.Errorf("warned %q; want one with %q", warned, tc.warn)
			}
		})
	}
}

// A program that is not here is named, for exit 127, unless the head
// starts it on other hosts.
func TestResolveNamesAMissingProgram(t *testing.T) {
	m := testMachine(env())
	m.lookPath = func(file string) (string, error) {
		if file == "here" {
			return "/bin/here", nil
		}
		return "", errors.New("not found")
	}
	var missing *missingProgramError
	if _, err := resolve(newFakeFlags(nil), []string{"gone", "x"}, m); !errors.As(err, &missing) || missing.program != "gone" {
		t.Errorf("missing program: %v", err)
	}
	if _, err := resolve(newFakeFlags(map[string]string{"python": "here"}), []string{"t.py"}, m); err != nil {
		t.Errorf("a script run by an interpreter that is here: %v", err)
	}
	if _, err := resolve(newFakeFlags(map[string]string{"hosts": "a,b"}), []string{"gone"}, m); err != nil {
		t.Errorf("head mode: %v", err)
	}
	// A usage error wins: exit 2 for what was typed wrong.
	var ue usageError
	if _, err := resolve(newFakeFlags(map[string]string{"pty": "x"}), []string{"gone"}, m); !errors.As(err, &ue) {
		t.Errorf("usage error and missing program: %v", err)
	}
}

// gorun's own failures have statuses of their own, apart from usage (2)
// and from what workers commonly exit with.
func TestFailureStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("launcher: start local rank 3: %w", &os.SyscallError{Syscall: "pipe2", Err: syscall.EMFILE}), exitResources},
		{fmt.Errorf("fork: %w", syscall.EAGAIN), exitResources},
		{&launcher.SSHError{Host: "node1", Op: "dial", Err: errors.New("refused")}, exitUnavailable},
		{fmt.Errorf("head: %w", &elastic.RendezvousError{Err: errors.New("rendezvous: join timeout")}), exitUnavailable},
		{errors.New("elastic: the job failed without a failure report"), exitInternal},
	} {
		if got := failureStatus(tc.err); got != tc.want {
			t.Errorf("%v: %d, want %d", tc.err, got, tc.want)
		}
	}
}

// TestReadNodeHosts: the host list a remote agent reads from stdin, the
// line after the secret's, leaves the rest of stdin (the head's EOF
// signal) unread.
func TestReadNodeHosts(t *testing.T) {
	for _, tc := range []struct {
		in, rest string
		want     []string
		err      string
	}{
		{in: "a,b,c\nrest", rest: "rest", want: []string{"a", "b", "c"}},
		{in: "only\n", want: []string{"only"}},
		{in: "\n", err: "an empty line"},
		{in: "a,b", err: "stdin closed before the line's end"},
	} {
		r := bufio.NewReader(strings.NewReader(tc.in))
		got, err := readNodeHosts(r)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: got %v, %v; want error %q", tc.in, got, err, tc.err)
			}
		case err != nil || !slices.Equal(got, tc.want):
			t.Errorf("%q: got %v, %v; want %v", tc.in, got, err, tc.want)
		default:
			if rest, _ := io.ReadAll(r); string(rest) != tc.rest {
				t.Errorf("%q: left %q, want %q", tc.in, rest, tc.rest)
			}
		}
	}
}
