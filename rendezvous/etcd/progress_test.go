package etcd

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
)

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A node waiting on etcd reports who is there and which expected hosts are
// not, and its join timeout names them.
func TestProgressOnEtcd(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	var logs lockedBuffer
	o := testOptions("progress", 0)
	o.MinNodes, o.MaxNodes, o.Host = 3, 3, "ha"
	o.Expected = []string{"ha", "hb", "hc"}
	o.JoinTimeout = 4 * time.Second
	o.Logger = zerolog.New(&logs)
	h := newHandler(t, c, o)
	start := time.Now()
	_, err := h.Next(context.Background())
	if want := "rendezvous: join timeout after 4s: 1 of min 3 nodes joined round 0; missing: hb, hc"; err == nil ||
		err.Error() != want || !errors.Is(err, rendezvous.ErrJoinTimeout) {
		t.Errorf("Next = %v, want %q", err, want)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("gave up after %v", took)
	}
	out := logs.String()
	for _, want := range []string{`"message":"waiting for nodes"`, `"joined":1`, `"nodes":"ha"`, `"missing":"hb, hc"`, `"until":"join timeout"`} {
		if !strings.Contains(out, want) {
			t.Errorf("no report with %s:\n%s", want, out)
		}
	}
}
