package launcher

import (
	"context"
	"errors"
	"io"
	"syscall"
	"time"
)

// defaultRetryBackoff is the first wait before dialing a host again.
const defaultRetryBackoff = 250 * time.Millisecond

// maxRetryBackoff bounds the wait before one retry.
const maxRetryBackoff = 10 * time.Second

// retryDial reports whether dialing again may cure err: sshd dropped the
// connection while it was being set up. Past its MaxStartups limit (10
// unauthenticated connections by default, then a growing share refused)
// sshd closes a new connection at once, which the client sees as EOF or a
// reset before or during the key exchange; a listener whose backlog is
// full, or an sshd restarting, refuses it. A failed authentication, an
// unknown or changed host key, a bad configuration, a timeout or a
// cancelled launch are not retried: they would fail the same way, or
// already took their time.
func retryDial(err error) bool {
	var se *SSHError
	if errors.As(err, &se) && se.Op != "dial" && se.Op != "handshake" {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	for _, cause := range []error{io.EOF, io.ErrUnexpectedEOF, syscall.ECONNRESET, syscall.ECONNREFUSED, syscall.ECONNABORTED, syscall.EPIPE} {
		if errors.Is(err, cause) {
			return true
		}
	}
	return false
}

// retryDelay is the wait before retry number attempt+1: base (0 =
// defaultRetryBackoff) doubled attempt times, at most maxRetryBackoff,
// scaled by a jitter of 0.5 to 1.5 (r, in [0, 1), draws it) so that hosts
// dropped together do not come back together.
func retryDelay(attempt int, base time.Duration, r float64) time.Duration {
	if base <= 0 {
		base = defaultRetryBackoff
	}
	d := base
	for range attempt {
		if d >= maxRetryBackoff {
			break
		}
		d *= 2
	}
	d = min(d, maxRetryBackoff)
	return time.Duration(float64(d) * (0.5 + r))
}
