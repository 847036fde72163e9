package torch2test

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

func TestMountPoints(t *testing.T) {
	info := "22 1 0:21 / /proc rw,nosuid - proc proc rw\n" +
		"36 22 8:1 / /mnt/with\\040space\\134slash rw - ext4 /dev/sda1 rw\n" +
		"37 22 8:1 / /mnt/not\\08 rw - ext4 /dev/sda1 rw\n" +
		"short line\n\n"
	want := []string{"/proc", `/mnt/with space\slash`, `/mnt/not\08`}
	if got := mountPoints([]byte(info)); !reflect.DeepEqual(got, want) {
		t.Errorf("mountPoints = %q, want %q", got, want)
	}
}

func TestBindsFor(t *testing.T) {
	for _, tc := range []struct {
		share, want []string
	}{
		{nil, []string{"/sys", "/dev", "/tmp"}},
		{[]string{"/tmp", "/tmp/", "/tmp/x/y"}, []string{"/sys", "/dev", "/tmp"}},
		{[]string{"/tmpfoo", "/var/tmp/a", "/var/tmp/a/b"}, []string{"/sys", "/dev", "/tmp", "/tmpfoo", "/var/tmp/a"}},
	} {
		if got := bindsFor(tc.share); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("bindsFor(%q) = %q, want %q", tc.share, got, tc.want)
		}
	}
}

func TestWithHostname(t *testing.T) {
	for _, tc := range []struct {
		hosts, want string
	}{
		{"127.0.0.1 localhost\n", "127.0.0.1 localhost\n127.0.0.1 box\n"},
		{"127.0.0.1 localhost", "127.0.0.1 localhost\n127.0.0.1 box\n"},
		{"", "127.0.0.1 box\n"},
		{"10.0.0.5\tbox.lan box\n", "10.0.0.5\tbox.lan box\n"},
		{"# box\n10.0.0.5 boxer\n", "# box\n10.0.0.5 boxer\n127.0.0.1 box\n"},
		{"10.0.0.5 a # box\n", "10.0.0.5 a # box\n127.0.0.1 box\n"},
		{"box 10.0.0.5\n", "box 10.0.0.5\n127.0.0.1 box\n"}, // the address, not a name
	} {
		if got := string(withHostname([]byte(tc.hosts), "box")); got != tc.want {
			t.Errorf("withHostname(%q) = %q, want %q", tc.hosts, got, tc.want)
		}
	}
}

// The root runs torch 2.6 with gloo, sees the host's temporary folders,
// and resolves the host's name.
func TestEnsure(t *testing.T) {
	share := t.TempDir()
	r := Require(t, Options{Dir: os.Getenv("GORUN_TORCH2_ROOT"), Share: []string{share}})
	if err := WriteSupport(share); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	argv := r.Python("-c", `import socket, sys, torch, torch.distributed as d
print(torch.__version__.split("+")[0], d.is_gloo_available(), "nolibuv.apply()" in open(sys.argv[1]).read(), bool(socket.gethostbyname(sys.argv[2])))`,
		filepath.Join(share, "sitecustomize.py"), host)
	out, err := exec.Command(argv[0], argv[1:]...).Output()
	if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	if got := strings.TrimSpace(string(out)); !strings.HasPrefix(got, "2.6") || !strings.HasSuffix(got, " True True True") {
		t.Errorf("torch, gloo, support file, hostname in the root: %q, want 2.6.x True True True", got)
	}
}

// Removing a root unmounts what is bound into it first: the bound folder's
// files survive, as the host's /tmp must when a broken root is rebuilt.
func TestRemoveSparesWhatIsMounted(t *testing.T) {
	testenv.MustHaveRoot(t, "bind mounts")
	host, root := t.TempDir(), filepath.Join(t.TempDir(), "root")
	keep := filepath.Join(host, "keep")
	if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &Root{Dir: root}
	if err := os.MkdirAll(filepath.Join(root, "proc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := r.mount([]string{host}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountUnder(root) })
	if _, err := os.Stat(filepath.Join(root, keep)); err != nil {
		t.Fatalf("%s is not seen in the root: %v", keep, err)
	}
	if err := r.mount([]string{host}); err != nil {
		t.Fatalf("mounting again: %v", err)
	}
	// host is under /tmp, which is bound already.
	if m, _ := mountsUnder(root); len(m) != 4 {
		t.Errorf("mounts under the root: %q, want proc, sys, dev and tmp once each", m)
	}
	if err := remove(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("the root is still there: %v", err)
	}
	if b, err := os.ReadFile(keep); err != nil || string(b) != "x" {
		t.Errorf("the shared folder lost its file: %q, %v", b, err)
	}
}
