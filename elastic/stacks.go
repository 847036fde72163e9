package elastic

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Stacks on demand. A Go worker's runtime, when its environment names a
// socket (workerenv.StacksSocket), answers each connection to it with the
// stacks of all its goroutines and goes on running. The agent makes one
// socket name per worker in its private status folder (a worker's log
// folder may be too deep for a socket's 107 bytes), asks through it for
// gorun status --stacks, and for the laggards' stacks of a hang analysis.
const (
	// stacksTimeout bounds one request for a worker's stacks.
	stacksTimeout = 5 * time.Second
	// maxStacks bounds the stacks read from one worker.
	maxStacks = 16 << 20
)

// stacksSocket is the socket of the worker of localRank of the agent of
// pid, in the status folder dir.
func stacksSocket(dir string, pid, localRank int) string {
	return filepath.Join(dir, strconv.Itoa(pid)+"-"+strconv.Itoa(localRank)+".stacks")
}

// socketCloser removes a worker's stacks socket when the attempt ends:
// the runtime removes it when the worker closes its group, but not when
// it is killed.
type socketCloser string

func (s socketCloser) Close() error {
	if err := os.Remove(string(s)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// askStacks reads the stacks of the worker whose socket is path.
func askStacks(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, stacksTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return "", fmt.Errorf("elastic: ask for stacks: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(dl)
	}
	b, err := io.ReadAll(io.LimitReader(conn, maxStacks))
	if err != nil {
		return "", fmt.Errorf("elastic: read stacks: %w", err)
	}
	return string(b), nil
}

// stacksOf reads the stacks of the worker of rank on this node: ok is
// false when no worker of this node has that rank, and err says why a
// worker's stacks cannot be had.
func (b *statusBoard) stacksOf(ctx context.Context, rank int) (stacks string, ok bool, err error) {
	b.mu.Lock()
	var s *slotState
	for i := range b.slots {
		if b.slots[i].rank == rank {
			s = &b.slots[i]
		}
	}
	var path string
	if s != nil {
		path = s.stacks
	}
	b.mu.Unlock()
	switch {
	case s == nil:
		return "", false, nil
	case path == "":
		return "", true, fmt.Errorf("elastic: rank %d cannot be asked for its stacks: the agent has no status folder, or runs Python workers", rank)
	}
	stacks, err = askStacks(ctx, path)
	if err != nil {
		return "", true, fmt.Errorf("%w (the worker does not use gorun's Go runtime, or has not called runtime.Init)", err)
	}
	return stacks, true, nil
}

// serveStacks answers GET /stacks/{rank} with the stacks of that worker
// of this node, as text.
func (b *statusBoard) serveStacks(w http.ResponseWriter, r *http.Request) {
	rank, err := strconv.Atoi(r.PathValue("rank"))
	if err != nil {
		http.Error(w, "elastic: rank "+strconv.Quote(r.PathValue("rank"))+" is not a number", http.StatusBadRequest)
		return
	}
	stacks, ok, err := b.stacksOf(r.Context(), rank)
	switch {
	case !ok:
		http.Error(w, fmt.Sprintf("elastic: rank %d is not a worker of this node", rank), http.StatusNotFound)
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadGateway)
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, stacks)
	}
}
