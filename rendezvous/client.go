package rendezvous

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// clientKeyPrefix goes in front of every user key on the wire, as torch's
// TCPStore does; only its "init/" counter goes without.
const clientKeyPrefix = "/"

// initKey counts the clients that gave a world size, as torch's does.
const initKey = "init/"

const (
	// probeTimeout bounds DialectAuto's VALIDATE+PING probe.
	probeTimeout = 2 * time.Second
	// cancelWaitTimeout bounds the CANCEL_WAIT exchange after a wait
	// timed out.
	cancelWaitTimeout = 5 * time.Second
)

// ClientOptions configures Dial. The zero value is usable.
type ClientOptions struct {
	// Timeout bounds Dial and each operation whose context has no
	// deadline (default DefaultTimeout).
	Timeout time.Duration
	// Dialect is the server's protocol (default DialectAuto).
	Dialect Dialect
	// WorldSize, when positive, makes Dial count this client in the
	// "init/" key (ADD +1), as torch's TCPStore does when given one.
	WorldSize int
	// Auth, when set, authenticates every connection before its first
	// request: the server must prove that it knows the secret, and this
	// client then proves it too (see Auth). Such a server is gorun's.
	Auth *Auth
}

// Client is a Store served by a TCPStore server: ours, or torch's own.
// Like torch's client it sends one request at a time, and puts "/" in
// front of every key. It is safe for concurrent use.
//
// Against a torch 1.13 server (Dialect113), MultiGet is WAIT then one GET
// per key, MultiSet one SET per key (not atomic), Append and Ping fail
// with errors.ErrUnsupported: an emulation by compare_set cannot tell its
// own success from a concurrent writer's, since the reply is the same.
type Client struct {
	addr      string
	opts      ClientOptions
	closed    context.Context // done once Close is called
	markClose context.CancelFunc

	// dialect is resolved by Dial, and constant once Dial returns: later
	// redials keep it.
	dialect Dialect

	mu     sync.Mutex // one request at a time, as torch's activeOpLock_
	conn   net.Conn   // nil once a failure left it unusable; redialled lazily
	r      frameReader
	w      frameWriter
	unbind func() // undoes bindContext; idempotent
}

var _ Store = (*Client)(nil)

// Dial connects to the TCPStore server at addr ("host:port"), retrying
// with exponential backoff until ctx (or opts.Timeout when ctx has no
// deadline) ends.
func Dial(ctx context.Context, addr string, opts ClientOptions) (*Client, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	c := &Client{addr: addr, opts: opts, dialect: opts.Dialect}
	c.closed, c.markClose = context.WithCancel(context.Background())
	c.r = frameReader{lim: ServerOptions{}.limits()} // replies: a default server's limits
	c.w = frameWriter{w: bufio.NewWriterSize(nil, connBufferSize)}
	c.r.r = bufio.NewReaderSize(nil, connBufferSize)

	dialCtx, cancel := withDefaultTimeout(ctx, opts.Timeout)
	defer cancel()
	c.mu.Lock()
	err := c.connect(dialCtx)
	c.mu.Unlock()
	if err != nil {
		c.Close()
		return nil, err
	}
	if opts.WorldSize > 0 {
		if _, err := c.add(ctx, initKey, 1); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Dialect returns the dialect the client speaks, resolved by Dial.
func (c *Client) Dialect() Dialect { return c.dialect }

// Close closes the connection; calls in progress and later ones return
// ErrClosed.
func (c *Client) Close() error {
	c.markClose()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropConn()
	return nil
}

// connect dials, with backoff, until a connection is ready for requests.
func (c *Client) connect(ctx context.Context) error {
	pause := 10 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := c.tryConnect(ctx)
		if err == nil {
			return nil
		}
		if permanentAuthError(err) {
			// The server answered; asking again gets the same answer.
			return fmt.Errorf("rendezvous: connect to %s: %w", c.addr, err)
		}
		if ctx.Err() == nil {
			timer := time.NewTimer(pause)
			select {
			case <-timer.C:
				pause = min(2*pause, time.Second)
				continue
			case <-ctx.Done():
				timer.Stop()
			}
		}
		return fmt.Errorf("rendezvous: connect to %s (%d attempts): %w: %w", c.addr, attempt, context.Cause(ctx), err)
	}
}

// tryConnect makes one attempt at a usable connection. DialectAuto probes
// for a v2 server first; a 1.13 server resets the connection on VALIDATE
// (it reads a SET with a huge key), so any failure of the probe on an
// established connection means 1.13, and we dial again to speak it.
func (c *Client) tryConnect(ctx context.Context) error {
	if err := c.dial(ctx); err != nil {
		return err
	}
	switch c.dialect {
	case Dialect113:
		return nil
	case DialectV2:
		// No PING: torch 2.2 to 2.4 servers do not know it.
		return c.handshake(ctx, false)
	}
	probeCtx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	switch err := c.handshake(probeCtx, true); {
	case err == nil:
		c.dialect = DialectV2
		return nil
	case ctx.Err() != nil, errors.Is(err, ErrSecretRequired):
		return err
	}
	c.dialect = Dialect113
	return c.dial(ctx)
}

func (c *Client) dial(ctx context.Context) error {
	c.dropConn()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return err
	}
	if c.opts.Auth != nil {
		deadline, _ := ctx.Deadline()
		if err := c.opts.Auth.authenticate(nc, deadline); err != nil {
			nc.Close()
			return err
		}
	}
	c.conn = nc
	c.r.r.Reset(flushingReader{flush: c.w.w.Flush, r: nc})
	c.w.w.Reset(nc)
	return nil
}

// handshake sends VALIDATE and, if ping, checks that a PING is echoed,
// as torch >= 2.5 clients do. It drops the connection on failure.
func (c *Client) handshake(ctx context.Context, ping bool) error {
	c.bindContext(ctx)
	defer c.unbind()
	_ = c.w.writeRequest(DialectV2, &request{op: opValidate, nonce: validateMagic})
	err := c.w.w.Flush()
	if ping && err == nil {
		err = c.ping()
	}
	if err != nil {
		c.dropConn()
	}
	return err
}

func (c *Client) ping() error {
	nonce := uint32(os.Getpid())
	_ = c.w.writeRequest(DialectV2, &request{op: opPing, nonce: nonce})
	echo := c.r.readU32()
	if err := c.r.takeErr(); err != nil {
		return err
	}
	if echo != nonce && isAuthBanner(echo) {
		return answer(ErrSecretRequired)
	}
	if echo != nonce {
		return fmt.Errorf("rendezvous: ping: got %#x back for nonce %#x", echo, nonce)
	}
	return nil
}

func (c *Client) dropConn() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// bindContext applies ctx to the connection's I/O: its deadline, and its
// cancellation as an immediate deadline. Once c.unbind returns, a late
// cancellation can no longer touch the connection, whose deadline the
// caller may then set anew.
func (c *Client) bindContext(ctx context.Context) {
	nc := c.conn
	deadline, _ := ctx.Deadline()
	_ = nc.SetDeadline(deadline)
	var mu sync.Mutex
	bound := true
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if bound {
			_ = nc.SetDeadline(time.Unix(1, 0))
		}
	})
	c.unbind = func() {
		stop()
		mu.Lock()
		bound = false
		mu.Unlock()
	}
}

// call runs one exchange with the server, fn, under the client lock: it
// dials again if an earlier failure dropped the connection, binds ctx to
// the I/O, and flushes what fn wrote. Any failure but a cleanly cancelled
// wait drops the connection, since a half-read reply would be taken for
// the next one's.
func (c *Client) call(ctx context.Context, op string, keys []string, fn func(ctx context.Context) error) error {
	ctx, cancel := withDefaultTimeout(ctx, c.opts.Timeout)
	defer cancel()
	ctx, cancelCause := context.WithCancelCause(ctx)
	defer cancelCause(nil)
	defer context.AfterFunc(c.closed, func() { cancelCause(ErrClosed) })()

	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.exchange(ctx, fn)
	if err == nil {
		return nil
	}
	return &OpError{Op: op, Keys: keys, Err: err}
}

func (c *Client) exchange(ctx context.Context, fn func(ctx context.Context) error) error {
	if c.closed.Err() != nil {
		return ErrClosed
	}
	if c.conn == nil {
		if err := c.connect(ctx); err != nil {
			return err
		}
	}
	c.bindContext(ctx)
	c.r.err = nil // what an aborted exchange left
	err := fn(ctx)
	if err == nil {
		err = c.w.w.Flush()
	}
	c.unbind()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrTimeout):
		return err // awaitKeys kept or dropped the connection as it must
	}
	c.dropConn()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		<-ctx.Done() // see awaitKeys
	}
	switch {
	case c.closed.Err() != nil:
		return ErrClosed
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("rendezvous: server closed the connection: %w", err)
	}
	return err
}

// send buffers req; call flushes it, or the next read does.
func (c *Client) send(req *request) error {
	return c.w.writeRequest(c.dialect, req)
}

// awaitKeys sends WAIT and blocks for STOP_WAITING. If ctx ends first, the
// server still holds the wait. A v2 client withdraws it with CANCEL_WAIT;
// a 1.13 client cannot, so it drops the connection lest the late
// STOP_WAITING be read as the reply to a later request.
func (c *Client) awaitKeys(ctx context.Context, keys []string) error {
	if err := c.send(&request{op: opWait, keys: keys}); err != nil {
		return err
	}
	reply := c.r.readU8()
	err := c.r.takeErr()
	switch {
	case err == nil && reply == stopWaiting:
		return nil
	case err == nil:
		return fmt.Errorf("rendezvous: unexpected wait reply %#x", reply)
	case !errors.Is(err, os.ErrDeadlineExceeded):
		return err
	}
	// The connection's deadline is ctx's (or was set when ctx ended), so
	// ctx is done, or about to notice.
	<-ctx.Done()
	cause := waitError(ctx)
	c.unbind()
	if c.dialect != DialectV2 || !errors.Is(cause, ErrTimeout) || c.cancelWait() != nil {
		c.dropConn()
	}
	return cause
}

// cancelWait sends CANCEL_WAIT and reads WAIT_CANCELED, after the
// STOP_WAITING that may have been on its way.
func (c *Client) cancelWait() error {
	_ = c.conn.SetDeadline(time.Now().Add(cancelWaitTimeout))
	_ = c.send(&request{op: opCancelWait})
	reply := c.r.readU8()
	if reply == stopWaiting {
		reply = c.r.readU8()
	}
	if err := c.r.takeErr(); err != nil {
		return err
	}
	if reply != waitCanceled {
		return fmt.Errorf("rendezvous: unexpected cancel_wait reply %#x", reply)
	}
	return nil
}

// wireKey is key as a TCPStore client sends it.
func wireKey(key string) string { return clientKeyPrefix + key }

func wireKeys(keys []string) []string {
	wire := make([]string, len(keys))
	for i, k := range keys {
		wire[i] = wireKey(k)
	}
	return wire
}

func (c *Client) Set(ctx context.Context, key string, value []byte) error {
	k := wireKey(key)
	return c.call(ctx, "set", []string{k}, func(context.Context) error {
		return c.send(&request{op: opSet, key: k, value: value})
	})
}

// Get waits for key, then reads it: WAIT then GET, as torch does.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	k := wireKey(key)
	var value []byte
	err := c.call(ctx, "get", []string{k}, func(ctx context.Context) error {
		if err := c.awaitKeys(ctx, []string{k}); err != nil {
			return err
		}
		if err := c.send(&request{op: opGet, key: k}); err != nil {
			return err
		}
		value = c.r.readValue()
		return c.r.takeErr()
	})
	return value, err
}

func (c *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	return c.add(ctx, wireKey(key), delta)
}

// add is Add on a key as it goes on the wire.
func (c *Client) add(ctx context.Context, k string, delta int64) (int64, error) {
	var n int64
	err := c.call(ctx, "add", []string{k}, func(context.Context) error {
		if err := c.send(&request{op: opAdd, key: k, delta: delta}); err != nil {
			return err
		}
		n = c.r.readI64()
		return c.r.takeErr()
	})
	return n, err
}

func (c *Client) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	k := wireKey(key)
	var reply []byte
	err := c.call(ctx, "compare_set", []string{k}, func(context.Context) error {
		if err := c.send(&request{op: opCompareSet, key: k, expected: expected, value: desired}); err != nil {
			return err
		}
		reply = c.r.readValue()
		return c.r.takeErr()
	})
	return reply, err
}

func (c *Client) Check(ctx context.Context, keys []string) (bool, error) {
	ks := wireKeys(keys)
	var ready bool
	err := c.call(ctx, "check", ks, func(context.Context) error {
		if err := c.send(&request{op: opCheck, keys: ks}); err != nil {
			return err
		}
		ready = c.r.readU8() == checkReady
		return c.r.takeErr()
	})
	return ready, err
}

func (c *Client) Wait(ctx context.Context, keys []string) error {
	ks := wireKeys(keys)
	return c.call(ctx, "wait", ks, func(ctx context.Context) error {
		return c.awaitKeys(ctx, ks)
	})
}

func (c *Client) Delete(ctx context.Context, key string) (bool, error) {
	k := wireKey(key)
	var deleted bool
	err := c.call(ctx, "delete_key", []string{k}, func(context.Context) error {
		if err := c.send(&request{op: opDelete, key: k}); err != nil {
			return err
		}
		deleted = c.r.readI64() == 1
		return c.r.takeErr()
	})
	return deleted, err
}

func (c *Client) NumKeys(ctx context.Context) (int64, error) {
	var n int64
	err := c.call(ctx, "num_keys", nil, func(context.Context) error {
		if err := c.send(&request{op: opNumKeys}); err != nil {
			return err
		}
		n = c.r.readI64()
		return c.r.takeErr()
	})
	return n, err
}

// MultiGet waits for every key, then reads them: with one MULTI_GET, or
// with pipelined GETs from a 1.13 server.
func (c *Client) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	ks := wireKeys(keys)
	values := make([][]byte, len(ks))
	err := c.call(ctx, "multi_get", ks, func(ctx context.Context) error {
		if err := c.awaitKeys(ctx, ks); err != nil {
			return err
		}
		if c.dialect == DialectV2 {
			_ = c.send(&request{op: opMultiGet, keys: ks})
		} else {
			for _, k := range ks {
				_ = c.send(&request{op: opGet, key: k})
			}
		}
		for i := range values {
			values[i] = c.r.readValue()
		}
		return c.r.takeErr()
	})
	if err != nil {
		return nil, err
	}
	return values, nil
}

// MultiSet sets every key: with one MULTI_SET, or with pipelined SETs to a
// 1.13 server.
func (c *Client) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	ks := wireKeys(keys)
	if len(keys) != len(values) {
		return &OpError{Op: "multi_set", Keys: ks, Err: errMultiSetLengths}
	}
	return c.call(ctx, "multi_set", ks, func(context.Context) error {
		if c.dialect == DialectV2 {
			return c.send(&request{op: opMultiSet, keys: ks, values: values})
		}
		for i, k := range ks {
			_ = c.send(&request{op: opSet, key: k, value: values[i]})
		}
		return nil
	})
}

// Append appends to key's value; torch 1.13 servers have no APPEND.
func (c *Client) Append(ctx context.Context, key string, value []byte) error {
	k := wireKey(key)
	if err := c.requireV2(); err != nil {
		return &OpError{Op: "append", Keys: []string{k}, Err: err}
	}
	return c.call(ctx, "append", []string{k}, func(context.Context) error {
		return c.send(&request{op: opAppend, key: k, value: value})
	})
}

// Ping checks that the server echoes a nonce (torch >= 2.5 servers, and
// ours); torch 1.13 servers have no PING.
func (c *Client) Ping(ctx context.Context) error {
	if err := c.requireV2(); err != nil {
		return &OpError{Op: "ping", Err: err}
	}
	return c.call(ctx, "ping", nil, func(context.Context) error { return c.ping() })
}

// requireV2 fails operations that a torch 1.13 server lacks.
func (c *Client) requireV2() error {
	if d := c.Dialect(); d != DialectV2 {
		return fmt.Errorf("%w by the %v protocol", errors.ErrUnsupported, d)
	}
	return nil
}
