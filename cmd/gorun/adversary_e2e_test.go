package main

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Issue 21, through the real CLI: while gorun's store is flooded with
// idle connections (more than gorun's open-files limit), WAIT storms and
// random bytes, its workers still meet through it, one of them fails, the
// group restarts (which needs new pipes) and the job finishes with its own
// status.
func TestStoreAttackDoesNotTakeTheJobDown(t *testing.T) {
	dir := t.TempDir()
	release := filepath.Join(dir, "go")
	w := script(t, dir, "w.sh", `while [ ! -e "`+release+`" ]; do sleep 0.05; done
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 3; fi
exec "`+bin("demo")+`"
`)
	// gorun may hold 1024 files: the flood below is twice that.
	a := startCommand(t, "sh", "-c", `ulimit -n 1024 && exec "$0" "$@"`,
		bin("gorun"), "--nproc-per-node", "4", "--max-restarts", "1", w)
	var port string
	if !waitFor(30*time.Second, func() bool {
		m := regexp.MustCompile(`store listening.*endpoint=127\.0\.0\.1:(\d+)`).FindStringSubmatch(a.out.String())
		if m != nil {
			port = m[1]
		}
		return m != nil
	}) {
		t.Fatalf("gorun did not say where its store listens:\n%s", a.out.String())
	}
	addr := "127.0.0.1:" + port

	// 2,048 idle connections, held until the end.
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	refused := 0
	for range 2048 {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			refused++
			continue
		}
		held = append(held, c)
	}
	// A WAIT storm on keys nobody sets, and connections of random bytes.
	for range 4 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		c.Write(waitStorm(5000))
	}
	for range 8 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		junk := make([]byte, 64<<10)
		rand.Read(junk)
		c.Write(junk)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code := a.wait(t, 90*time.Second)
	out := a.out.String()
	if code != 0 || !strings.Contains(out, "restarting (1/1)") || !strings.Contains(out, "all workers succeeded restarts=1") {
		t.Fatalf("want the job to restart once and succeed despite the attack, got %d:\n%s", code, out)
	}
	if n := strings.Count(out, "was the last of 4 ranks to arrive"); n != 1 {
		t.Errorf("the workers did not all meet through the store (%d ranks last):\n%s", n, out)
	}
	t.Logf("attack: %d connections held open by the test, %d refused at connect; job finished with a restart", len(held), refused)
}

// waitStorm is torch 2.x's VALIDATE, then one WAIT naming n keys that
// nobody sets (query types 0 and 6 of the protocol).
func waitStorm(n int) []byte {
	const validateQuery, validateMagic, waitQuery = 0, 0x3C85F7CE, 6
	b := []byte{validateQuery}
	b = binary.LittleEndian.AppendUint32(b, validateMagic)
	b = append(b, waitQuery)
	b = binary.LittleEndian.AppendUint64(b, uint64(n))
	for i := range n {
		key := fmt.Sprintf("never/%d", i)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(key)))
		b = append(b, key...)
	}
	return b
}
