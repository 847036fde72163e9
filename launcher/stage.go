package launcher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Binary is a local executable to stage on remote hosts (gorun --stage-binary):
// the head's own gorun, for hosts that do not have it.
type Binary struct {
	Path string
	Size int64
	// Sum is the file's SHA-256, which names the staged copy, so that
	// hosts keep one copy per version and two versions never clash.
	Sum string
}

// OpenBinary reads path's size and checksum.
func OpenBinary(path string) (Binary, error) {
	f, err := os.Open(path)
	if err != nil {
		return Binary{}, fmt.Errorf("launcher: binary to stage: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return Binary{}, fmt.Errorf("launcher: binary to stage: %w", err)
	}
	return Binary{Path: path, Size: n, Sum: hex.EncodeToString(h.Sum(nil))}, nil
}

// unameMachine is uname -m's name of each GOARCH that Linux hosts run.
var unameMachine = map[string]string{
	"amd64": "x86_64", "arm64": "aarch64", "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64",
}

// stageBinary makes sure the host of c has b at remote, or, when remote is empty, in
// its cache folder ($XDG_CACHE_HOME or ~/.cache, then gorun/) under a name
// made of b's checksum. It copies b only when the host lacks that file, and
// returns the remote path. A file already at an explicit remote path is
// used as it is. The copy is written beside its destination and renamed
// into place once whole, so a concurrent launch never runs half a file;
// a host of another OS or architecture is refused, since b cannot run there.
// env is added to the remote shell's environment (XDG_CACHE_HOME, say).
func stageBinary(ctx context.Context, c Conn, b Binary, remote string, env []string) (path string, copied bool, err error) {
	dest := `"${XDG_CACHE_HOME:-$HOME/.cache}/gorun/gorun-` + b.Sum[:16] + `"`
	if remote != "" {
		dest = shellQuote(remote)
	}
	out, err := c.Output(ctx, env, `f=`+dest+`; uname -sm; printf '%s\n' "$f"; if [ -x "$f" ]; then echo present; else echo absent; fi`, nil)
	if err != nil {
		return "", false, fmt.Errorf("stage %s: %w", b.Path, err)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != 3 {
		return "", false, fmt.Errorf("stage %s on %s: unexpected answer %q", b.Path, c.Host(), out)
	}
	system, path, state := lines[0], lines[1], lines[2]
	if want := "Linux " + unameMachine[runtime.GOARCH]; runtime.GOOS != "linux" || system != want {
		return "", false, fmt.Errorf("stage %s on %s: the host is %q and this gorun is %s/%s: install a gorun built for it and pass --remote-gorun", b.Path, c.Host(), system, runtime.GOOS, runtime.GOARCH)
	}
	if state == "present" {
		return path, false, nil
	}
	f, err := os.Open(b.Path)
	if err != nil {
		return "", false, fmt.Errorf("stage %s: %w", b.Path, err)
	}
	defer f.Close()
	q := shellQuote(path)
	script := `set -e; mkdir -p "$(dirname ` + q + `)"; t=$(mktemp ` + shellQuote(path+".XXXXXX") + `); trap 'rm -f "$t"' EXIT; ` +
		`cat > "$t"; n=$(wc -c < "$t"); [ "$n" -eq ` + strconv.FormatInt(b.Size, 10) + ` ] || { echo "received $n of ` + strconv.FormatInt(b.Size, 10) + ` bytes" >&2; exit 1; }; ` +
		`chmod 755 "$t"; mv -f "$t" ` + q + `; trap - EXIT`
	if _, err := c.Output(ctx, env, script, f); err != nil {
		return "", false, fmt.Errorf("stage %s at %s on %s: %w", b.Path, path, c.Host(), err)
	}
	return path, true, nil
}
