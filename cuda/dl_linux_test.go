package cuda

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

// A failed load says why, however busy the process: the reason comes from
// dlerror, which answers per thread, so a goroutine that moved between the
// load and the question used to get none, and a missing file read as an
// unnamed failure (LoadError then listed it with an empty reason).
func TestDlopenSaysWhyUnderLoad(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libabsent.so")
	const goroutines, loads = 8, 2000
	var wg sync.WaitGroup
	failures := make(chan string, goroutines)
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range loads {
				h, err := dlopen(missing)
				if h != 0 || err == nil || !notFound(err) {
					failures <- fmt.Sprintf("dlopen of a missing file: handle %#x, error %v", h, err)
					return
				}
			}
		}()
	}
	// Goroutines that only compute, for the scheduler to preempt the loads'.
	stop := make(chan struct{})
	for range goroutines {
		go func() {
			x := 0
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i := range 1 << 16 {
					x += i
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	close(failures)
	for f := range failures {
		t.Error(f)
	}
}
