package runtime

import (
	"errors"
	"net"
	"runtime/pprof"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/workerenv"
)

// StacksSocketEnv names a unix socket on which the runtime answers the
// launcher's requests for the worker's stacks (gorun status --stacks, and
// the laggards' stacks of a hang analysis): each connection receives the
// stacks of every goroutine, as a panic prints them, and is closed. The
// worker keeps running: unlike SIGQUIT, asking stops nothing.
const StacksSocketEnv = workerenv.StacksSocket

// stacksWriteTimeout bounds the writing of one answer, so that a reader
// that stops reading does not hold the answering goroutine.
const stacksWriteTimeout = 10 * time.Second

// serveStacks listens on the socket the launcher named, adding its close
// to release; without the variable it does nothing, and a socket that
// cannot be made only blinds gorun status, so it is logged, not fatal.
// One goroutine answers, blocked in Accept between requests: it costs
// nothing while nobody asks.
func (c *config) serveStacks(log zerolog.Logger, release *cleanups) {
	path, ok := c.lookupEnv(StacksSocketEnv)
	if !ok || path == "" {
		return
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		log.Warn().Err(err).Msg("gorun status will not see this worker's stacks")
		return
	}
	go answerStacks(l)
	release.add(l.Close) // which removes the socket's file
}

// answerStacks writes the goroutines' stacks to every connection l
// accepts, until l is closed.
func answerStacks(l net.Listener) {
	for {
		conn, err := l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors, say: the next request may find some.
			time.Sleep(100 * time.Millisecond)
			continue
		}
		conn.SetWriteDeadline(time.Now().Add(stacksWriteTimeout))
		pprof.Lookup("goroutine").WriteTo(conn, 2)
		conn.Close()
	}
}
