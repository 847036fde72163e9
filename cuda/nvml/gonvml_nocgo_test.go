//go:build !cgo

package nvml

import (
	"errors"
	"testing"
)

func TestWithoutCgoNVMLSaysSo(t *testing.T) {
	n, err := CountVisible(New(), func(string) (string, bool) { return "", false })
	if n != 0 || !errors.Is(err, ErrNoCgo) {
		t.Errorf("CountVisible = %d, %v; want 0 and ErrNoCgo", n, err)
	}
}
