// Package rawio reads and writes non-blocking descriptors with raw system
// calls. None of them can block, and a plain system call tells the Go
// scheduler that the thread may be stuck: for a long one (a megabyte's
// copy) its monitor then hands the processor to another thread, and takes
// it back when the call returns, a context switch each; for the thousands
// of short ones a store's init makes, each call pays the hand-off's
// bookkeeping. A raw call looks to the scheduler like ordinary
// computation. The collective transport and the store's event loop share
// it.
package rawio
