package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/cuda"
	"github.com/gorun/gorun/internal/testenv"
)

// fakeNode is a Config whose every input is a stand-in.
func fakeNode(port StorePort, environ ...string) Config {
	return Config{
		StorePort:  port,
		Python:     "python3",
		LookupEnv:  env(),
		Environ:    func() []string { return environ },
		Hostname:   func() (string, error) { return "node7", nil },
		LookupHost: func(context.Context, string) ([]string, error) { return []string{"10.0.0.7"}, nil },
		Interfaces: func() ([]Interface, error) {
			return []Interface{{Name: "lo", Up: true, Loopback: true, MTU: 65536}}, nil
		},
		NVML:      noDriver{},
		Libraries: fakeLibraries{},
		AskPython: func(context.Context, string) (PythonInfo, error) {
			return PythonInfo{Executable: "/usr/bin/python3", Version: "3.11.2", Torch: "2.6.0", Gloo: true, NCCL: true, NCCLVersion: "2.21.5", CUDA: "12.4"}, nil
		},
	}
}

func TestReportSections(t *testing.T) {
	var b strings.Builder
	if err := Write(context.Background(), &b, fakeNode(StorePort{Port: freePort(t), Source: "--master-port"})); err != nil {
		t.Fatal(err)
	}
	last := -1
	for _, section := range []string{"== Host\n", "== GPUs (NVML)\n", "== Python\n", "== NCCL and CUDA libraries\n", "== Network interfaces\n", "== Store port\n", "== Slurm\n"} {
		at := strings.Index(b.String(), section)
		if at < 0 || at < last {
			t.Errorf("no %q after the previous section:\n%s", section, b.String())
		}
		last = at
	}
	wantLines(t, b.String(), "hostname: node7\nresolves to: 10.0.0.7\n", "lo  up  loopback  mtu 65536  no address\n")
}

// failingWriter fails every write.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestReportWriteError(t *testing.T) {
	err := Write(context.Background(), failingWriter{}, fakeNode(StorePort{Port: freePort(t), Source: "test"}))
	if err == nil || err.Error() != "doctor: write the report: disk full" {
		t.Errorf("got %v; want the write error", err)
	}
}

func TestDefaultsSearchPythonExec(t *testing.T) {
	cfg := Config{LookupEnv: env("PYTHON_EXEC", "/opt/venv/bin/python")}.withDefaults()
	if search, ok := cfg.Libraries.(cuda.Search); cfg.Python != "/opt/venv/bin/python" || !ok || search.Python != cfg.Python {
		t.Errorf("Python %q, Libraries %#v; want $PYTHON_EXEC in both", cfg.Python, cfg.Libraries)
	}
	cfg = Config{Python: "python3.12", LookupEnv: env("PYTHON_EXEC", "/opt/venv/bin/python")}.withDefaults()
	if cfg.Python != "python3.12" {
		t.Errorf("Python %q; want the one given", cfg.Python)
	}
	if cfg = (Config{LookupEnv: env()}).withDefaults(); cfg.Python != "python3" {
		t.Errorf("Python %q; want python3", cfg.Python)
	}
}

func TestHostResolvingToLoopbackOnly(t *testing.T) {
	var b strings.Builder
	writeHost(context.Background(), &report{w: &b},
		func() (string, error) { return "node7", nil },
		func(context.Context, string) ([]string, error) { return []string{"127.0.1.1", "::1"}, nil })
	wantLines(t, b.String(), "resolves to: 127.0.1.1, ::1 (loopback only: other nodes cannot reach this one by its name")

	b.Reset()
	writeHost(context.Background(), &report{w: &b},
		func() (string, error) { return "", errors.New("uname failed") },
		func(context.Context, string) ([]string, error) { t.Error("looked up an unknown name"); return nil, nil })
	wantLines(t, b.String(), "hostname: unknown (uname failed)\n")
}

func TestNetworkSection(t *testing.T) {
	var b strings.Builder
	ifaces := func() ([]Interface, error) {
		return []Interface{
			{Name: "lo", Up: true, Loopback: true, MTU: 65536, Addrs: []string{"127.0.0.1/8", "::1/128"}},
			{Name: "ib0", MTU: 2044, AddrsErr: errors.New("permission denied")},
		}, nil
	}
	writeNetwork(&report{w: &b}, ifaces, env("NCCL_SOCKET_IFNAME", "ib0"))
	wantLines(t, b.String(),
		"lo   up    loopback  mtu 65536  127.0.0.1/8 ::1/128\n",
		"ib0  down            mtu 2044   (addresses unknown: permission denied)\n",
		"NCCL_SOCKET_IFNAME=ib0\n",
	)

	b.Reset()
	writeNetwork(&report{w: &b}, func() ([]Interface, error) { return nil, errors.New("no netlink") }, env())
	wantLines(t, b.String(), "cannot list them: no netlink\n")
}

func TestNetworkOfThisHost(t *testing.T) {
	ifaces, err := systemInterfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifaces {
		if ifc.Loopback && ifc.Up && strings.Contains(strings.Join(ifc.Addrs, " "), "127.0.0.1/8") {
			return
		}
	}
	t.Errorf("no loopback interface with 127.0.0.1/8 among %+v", ifaces)
}

// freePort is a TCP port nothing listens on, a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestStorePort(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	busy := held.Addr().(*net.TCPAddr).Port
	var b strings.Builder
	writePort(&report{w: &b}, StorePort{Port: busy, Source: "--master-port"})
	wantLines(t, b.String(), strconv.Itoa(busy)+"/tcp (--master-port): busy on this host: ")

	free := freePort(t)
	b.Reset()
	writePort(&report{w: &b}, StorePort{Port: free, Source: "torchrun's default"})
	wantLines(t, b.String(), fmt.Sprintf("%d/tcp (torchrun's default): free on this host\n", free))
}

func TestSlurmSection(t *testing.T) {
	cases := []struct {
		environ []string
		want    []string
	}{
		{[]string{"PATH=/bin"}, []string{"not inside a Slurm job (no SLURM_* variable)\n"}},
		{[]string{"SLURM_JOB_ID=77"}, []string{"inside a Slurm job but not an srun step", "  SLURM_JOB_ID=77\n"}},
		{
			[]string{"SLURM_STEP_NODELIST=gpu[07-08]", "SLURM_JOB_ID=77", "SLURM_STEP_ID=0", "SLURM_NNODES=2", "SLURM_NODEID=1", "SLURM_GPUS_ON_NODE=4"},
			[]string{"srun step of job 77: node 1 of 2, store on gpu07:29477, GPUs on node 4\n", "  SLURM_JOB_ID=77\n  SLURM_NNODES=2\n"},
		},
	}
	for _, tc := range cases {
		var b strings.Builder
		writeSlurm(&report{w: &b}, tc.environ)
		wantLines(t, b.String(), tc.want...)
	}
}

func TestPythonSection(t *testing.T) {
	for _, tc := range []struct {
		info PythonInfo
		err  error
		want string
	}{
		{PythonInfo{Executable: "/usr/bin/python3", Version: "3.11.2", Torch: "2.6.0", Gloo: true, NCCL: true, NCCLVersion: "2.21.5", CUDA: "12.4"}, nil,
			"interpreter: /usr/bin/python3 (Python 3.11.2), from python3\ntorch: 2.6.0\n  gloo: yes\n  nccl: yes, NCCL 2.21.5, CUDA 12.4\n"},
		{PythonInfo{Executable: "/v/bin/python", Version: "3.12.1", TorchError: "ModuleNotFoundError: No module named 'torch'"}, nil,
			"torch: does not import: ModuleNotFoundError: No module named 'torch' (install python3-torch"},
		{PythonInfo{}, errors.New("exec: not found"), "python3: cannot run it: exec: not found"},
	} {
		cfg := fakeNode(StorePort{Port: freePort(t), Source: "test"})
		cfg.AskPython = func(context.Context, string) (PythonInfo, error) { return tc.info, tc.err }
		var b strings.Builder
		if err := Write(context.Background(), &b, cfg); err != nil {
			t.Fatal(err)
		}
		wantLines(t, b.String(), tc.want)
	}
}

// AskPython asks a real interpreter; this one has no torch, or has it.
func TestAskPython(t *testing.T) {
	py := testenv.MustHaveCommand(t, "python3", "python3")
	info, err := AskPython(context.Background(), py)
	if err != nil || info.Version == "" || info.Executable == "" || (info.Torch == "") == (info.TorchError == "") {
		t.Errorf("got %+v, %v; want a version, a path, and torch's version or why it does not import", info, err)
	}
	if _, err := AskPython(context.Background(), "/bin/false"); err == nil {
		t.Error("an interpreter that fails: no error")
	}
}
