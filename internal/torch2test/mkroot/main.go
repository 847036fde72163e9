// Command mkroot builds and mounts the torch 2.6 root of the interop tests
// (see package torch2test) before they run, as CI does: the tests would
// build it themselves, but inside their time limits. The root is
// $GORUN_TORCH2_ROOT, or torch2test.DefaultDir.
//
//	go run ./internal/torch2test/mkroot
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/gorun/gorun/internal/torch2test"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	r, err := torch2test.Ensure(ctx, torch2test.Options{Dir: os.Getenv("GORUN_TORCH2_ROOT"), Share: []string{os.TempDir()}, Log: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkroot:", err)
		os.Exit(1)
	}
	argv := r.Python("-c", "import torch, torch.distributed as d; print('torch', torch.__version__, 'gloo', d.is_gloo_available())")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "mkroot:", err)
		os.Exit(1)
	}
	fmt.Println("root", r.Dir)
}
