package rendezvous_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"time"

	"github.com/gorun/gorun/rendezvous"
)

// A store served to TCPStore clients, gorun's and torch's, as a
// launcher serves its job's: Serve accepts until Shutdown or Close.
func ExampleServer() {
	l, err := net.Listen("tcp", "127.0.0.1:0") // in a launcher: ":29500"
	if err != nil {
		log.Fatal(err)
	}
	srv := rendezvous.NewServer(rendezvous.ServerOptions{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	ctx := context.Background()
	client, err := rendezvous.Dial(ctx, l.Addr().String(), rendezvous.ClientOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Set(ctx, "greeting", []byte("hello")); err != nil {
		log.Fatal(err)
	}
	client.Close()

	// Shutdown lets requests in flight finish; Close would not wait.
	if err := srv.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-served)
	// Output: rendezvous: server closed
}

// The server's own process reaches the store without a connection.
// Clients put "/" in front of every key on the wire, as torch's do; a
// PrefixStore with an empty prefix does the same, so that the two share
// their keys.
func ExampleServer_Store() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := rendezvous.NewServer(rendezvous.ServerOptions{})
	go srv.Serve(l)
	defer srv.Close()
	ctx := context.Background()

	client, err := rendezvous.Dial(ctx, l.Addr().String(), rendezvous.ClientOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if err := client.Set(ctx, "worker/0", []byte("10.0.0.1:4000")); err != nil {
		log.Fatal(err)
	}

	view := rendezvous.NewPrefixStore("", srv.Store())
	value, err := view.Get(ctx, "worker/0")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", value)
	// Output: 10.0.0.1:4000
}

// Dial connects to a TCPStore server: gorun's, or torch's own.
func ExampleDial() {
	addr, stop := serve()
	defer stop()
	ctx := context.Background()

	client, err := rendezvous.Dial(ctx, addr, rendezvous.ClientOptions{Timeout: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	if err := client.Set(ctx, "master", []byte("10.0.0.1:29500")); err != nil {
		log.Fatal(err)
	}
	master, err := client.Get(ctx, "master") // waits for the key to exist
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("master at %s\n", master)

	keys := []string{"rank/0", "rank/1"}
	if err := client.MultiSet(ctx, keys, [][]byte{[]byte("a"), []byte("b")}); err != nil {
		log.Fatal(err)
	}
	values, err := client.MultiGet(ctx, keys)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %s\n", values[0], values[1])
	// Output:
	// master at 10.0.0.1:29500
	// a b
}

// Add is the store's counter: each caller gets a number of its own, and
// every caller sees the same total.
func ExampleClient_Add() {
	addr, stop := serve()
	defer stop()
	ctx := context.Background()
	client := dial(addr)
	defer client.Close()

	for range 3 {
		ticket, err := client.Add(ctx, "arrived", 1)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("ticket", ticket)
	}
	total, err := client.Add(ctx, "arrived", 0) // read without changing
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("total", total)
	// Output:
	// ticket 1
	// ticket 2
	// ticket 3
	// total 3
}

// Wait blocks until every key exists, or its context ends.
func ExampleClient_Wait() {
	addr, stop := serve()
	defer stop()
	ctx := context.Background()
	waiter, setter := dial(addr), dial(addr)
	defer waiter.Close()
	defer setter.Close()

	done := make(chan error)
	go func() { done <- waiter.Wait(ctx, []string{"ready"}) }()
	if err := setter.Set(ctx, "ready", []byte("1")); err != nil {
		log.Fatal(err)
	}
	fmt.Println("wait:", <-done)

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err := waiter.Wait(short, []string{"never"})
	fmt.Println("timed out:", errors.Is(err, rendezvous.ErrTimeout))
	// Output:
	// wait: <nil>
	// timed out: true
}

// CompareSet elects one leader among racing candidates: the first to
// swap an empty value for its name wins, and every candidate learns the
// winner from the reply.
func ExampleClient_CompareSet() {
	addr, stop := serve()
	defer stop()
	ctx := context.Background()
	client := dial(addr)
	defer client.Close()

	for _, candidate := range []string{"node-a", "node-b"} {
		leader, err := client.CompareSet(ctx, "leader", nil, []byte(candidate))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: leader is %s\n", candidate, leader)
	}
	// Output:
	// node-a: leader is node-a
	// node-b: leader is node-a
}

// Delete removes a key; NumKeys counts every key in the store.
func ExampleClient_Delete() {
	addr, stop := serve()
	defer stop()
	ctx := context.Background()
	client := dial(addr)
	defer client.Close()

	for _, k := range []string{"a", "b", "c"} {
		if err := client.Set(ctx, k, []byte("x")); err != nil {
			log.Fatal(err)
		}
	}
	deleted, err := client.Delete(ctx, "b")
	if err != nil {
		log.Fatal(err)
	}
	again, err := client.Delete(ctx, "b")
	if err != nil {
		log.Fatal(err)
	}
	n, err := client.NumKeys(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(deleted, again, n)
	// Output: true false 2
}

// A PrefixStore keeps one job's keys apart from another's in a shared
// store, as torch's PrefixStore does: key k is stored as prefix/k.
func ExamplePrefixStore() {
	addr, stop := serve()
	defer stop()
	ctx := context.Background()
	client := dial(addr)
	defer client.Close()

	first := rendezvous.NewPrefixStore("/worker/attempt_0", client)
	second := rendezvous.NewPrefixStore("/worker/attempt_1", client)
	if err := first.Set(ctx, "rank0", []byte("old")); err != nil {
		log.Fatal(err)
	}
	if err := second.Set(ctx, "rank0", []byte("new")); err != nil {
		log.Fatal(err)
	}
	old, err := client.Get(ctx, "/worker/attempt_0/rank0")
	if err != nil {
		log.Fatal(err)
	}
	current, err := second.Get(ctx, "rank0")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %s\n", old, current)
	// Output: old new
}

// A MemoryStore is the store within one process, for ranks that are
// goroutines, and for tests.
func ExampleNewMemoryStore() {
	store := rendezvous.NewMemoryStore(time.Minute) // each blocking call's timeout
	defer store.Close()
	ctx := context.Background()

	go store.Set(ctx, "answer", []byte("42"))
	value, err := store.Get(ctx, "answer") // waits for the Set
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", value)
	// Output: 42
}

// serve starts a store server on the loopback interface for an example,
// and returns its address and what stops it.
func serve() (addr string, stop func()) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := rendezvous.NewServer(rendezvous.ServerOptions{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	return l.Addr().String(), func() { srv.Close(); <-served }
}

// dial connects a client to addr for an example.
func dial(addr string) *rendezvous.Client {
	client, err := rendezvous.Dial(context.Background(), addr, rendezvous.ClientOptions{Timeout: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	return client
}
