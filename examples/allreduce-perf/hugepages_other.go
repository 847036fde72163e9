//go:build !linux

package main

import "errors"

const hugeMin = 4 << 20

func allocHuge(n int) ([]byte, func(), error) {
	return nil, nil, errors.New("no transparent huge pages here")
}
