// Command demo is the worker that `make run` starts: every rank publishes a
// greeting in the launcher's store, reads every other rank's, and prints
// what it received. It needs nothing but torchrun's environment.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/gorun/gorun/rendezvous"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	rank, world := envInt("RANK"), envInt("WORLD_SIZE")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	addr := net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
	client, err := rendezvous.Dial(ctx, addr, rendezvous.ClientOptions{})
	if err != nil {
		return err
	}
	defer client.Close()
	// Workers share the agent's store under a prefix per restart, exactly
	// as torch's env:// initialisation does.
	store := rendezvous.NewPrefixStore("/worker/attempt_"+os.Getenv("TORCHELASTIC_RESTART_COUNT"), client)

	host, _ := os.Hostname()
	greeting := fmt.Sprintf("hello from rank %d (pid %d on %s)", rank, os.Getpid(), host)
	if err := store.Set(ctx, "demo/greeting/"+strconv.Itoa(rank), []byte(greeting)); err != nil {
		return err
	}
	keys := make([]string, world)
	for r := range keys {
		keys[r] = "demo/greeting/" + strconv.Itoa(r)
	}
	greetings, err := store.MultiGet(ctx, keys)
	if err != nil {
		return err
	}
	for r, g := range greetings {
		if r != rank {
			fmt.Printf("rank %d of %d received from rank %d: %q\n", rank, world, r, g)
		}
	}
	// The last rank to arrive counts everyone in, so the sum proves that
	// all of them met.
	arrived, err := store.Add(ctx, "demo/arrived", 1)
	if err != nil {
		return err
	}
	if arrived == int64(world) {
		fmt.Printf("rank %d was the last of %d ranks to arrive\n", rank, world)
	}
	return nil
}

func envInt(key string) int {
	n, err := strconv.Atoi(os.Getenv(key))
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %s=%q: run me under gorun or torchrun\n", key, os.Getenv(key))
		os.Exit(2)
	}
	return n
}
