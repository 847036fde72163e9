package main

import (
	"os"
	"testing"

	"github.com/creack/pty"
)

// Output sent to /dev/null, a character device, is no terminal: the
// workers of `gorun ... > /dev/null` get pipes, not a terminal each.
func TestIsTerminal(t *testing.T) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if isTerminal(null) {
		t.Error("/dev/null is a terminal")
	}
	master, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	defer tty.Close()
	if !isTerminal(tty) {
		t.Error("a pseudo-terminal is not a terminal")
	}
}
