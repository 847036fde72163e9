package cuda

import (
	"unsafe"

	"github.com/ebitengine/purego"
)

// A symbol ties a C function of a loaded library to the Go function
// variable (fn, a pointer to a func) that calls it. Optional symbols are
// features of newer library versions: their variable stays nil when the
// library lacks them.
type symbol struct {
	name     string
	fn       any
	optional bool
}

// bind looks every symbol up in the library h and registers those found.
// It returns the names of the required ones that are missing, so that a
// library too old for us is reported, not a panic in RegisterLibFunc.
func bind(h uintptr, symbols []symbol) (missing []string) {
	for _, s := range symbols {
		addr, ok := dlsym(h, s.name)
		if !ok {
			if !s.optional {
				missing = append(missing, s.name)
			}
			continue
		}
		purego.RegisterFunc(s.fn, addr)
	}
	return missing
}

// goString copies the NUL-terminated C string at p; nil gives "".
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}
