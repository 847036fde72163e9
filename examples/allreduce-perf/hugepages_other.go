//go:build !linux

package main

import "errors"

// hugeMin is hugepages_linux.go's; it matters only where allocHuge can.
const hugeMin = 4 << 20

// allocHuge fails here: the caller falls back to the Go heap.
func allocHuge(n int) ([]byte, func(), error) {
	return nil, nil, errors.New("no transparent huge pages here")
}
