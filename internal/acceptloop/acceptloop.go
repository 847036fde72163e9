// Package acceptloop is the accept loop of gorun's servers, the store's
// (rendezvous) and the collective transports': it hands each connection
// to its owner, and rides out the errors a loaded machine gives
// (EMFILE, ENFILE, ECONNABORTED, ...) by pausing, as net/http does,
// instead of spinning on them or giving up the listener.
package acceptloop

import (
	"errors"
	"net"
	"time"

	"github.com/rs/zerolog"
)

// The pause after an accept error doubles from firstPause up to
// maxPause while errors follow one another: short enough that a burst
// of EMFILE costs clients little, long enough that a listener failing
// for good does not fill the log or a core.
const (
	firstPause = 5 * time.Millisecond
	maxPause   = time.Second
)

// NextPause is how long to pause after an accept error when the pause
// before it was last (0 when the last accept succeeded).
func NextPause(last time.Duration) time.Duration {
	return min(max(2*last, firstPause), maxPause)
}

// Serve accepts connections on l and hands each to handle, until done
// is closed, handle returns false, or l is closed. It returns nil in the
// first two cases and the listener's error (wrapping net.ErrClosed) in
// the third. Any other accept error is logged and retried after
// NextPause; done cuts the pause short.
//
// Serve leaves l open: its owner closes done and then l, which ends an
// Accept in progress. handle runs on Serve's goroutine, so it must not
// block: it starts the connection's own goroutine, or refuses it.
func Serve(l net.Listener, done <-chan struct{}, log zerolog.Logger, handle func(net.Conn) bool) error {
	var pause time.Duration
	for {
		c, err := l.Accept()
		if err == nil {
			pause = 0
			if !handle(c) {
				return nil
			}
			continue
		}
		select {
		case <-done:
			return nil
		default:
		}
		if errors.Is(err, net.ErrClosed) {
			return err
		}
		pause = NextPause(pause)
		log.Warn().Err(err).Dur("retry_in", pause).Msg("accept failed")
		timer := time.NewTimer(pause)
		select {
		case <-timer.C:
		case <-done:
			timer.Stop()
			return nil
		}
	}
}
