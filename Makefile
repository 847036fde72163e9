# gorun: `make run` shows a real job, `make test` runs every test.
GO          ?= go
BIN         := bin
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME    ?= 100000x

.PHONY: all build gpu-bin run test test-laptop fuzz lint bench bench-compare clean

all: build

# urfave_cli_no_docs leaves out the CLI library's man page generator and
# the Markdown parser it initialises at every launch, and in the keeper
# (about 0.4 of the 1.1 ms gorun's packages take to initialise).
build:
	$(GO) build -tags urfave_cli_no_docs -o $(BIN)/gorun ./cmd/gorun
	$(GO) build -o $(BIN)/ ./examples/...

# What scripts/gpu-check.sh runs on a GPU machine, which needs no Go:
# built without cgo and stripped (about 40 MB), to copy there with the
# tree (docs/gpu.md); the store's interop tests against torch's server
# go as a test binary.
gpu-bin:
	CGO_ENABLED=0 $(GO) build -tags urfave_cli_no_docs -ldflags='-s -w' -o $(BIN)/gpu/ \
		./cmd/gorun ./examples/gpucheck ./examples/allreduce-perf ./examples/copy-perf
	CGO_ENABLED=0 $(GO) test -c -ldflags='-s -w' -o $(BIN)/gpu/rendezvous.test ./rendezvous

# Four local workers train a model data-parallel: gradients are averaged
# with all_reduce, the loss falls, and the parameters stay identical.
run: build
	$(BIN)/gorun --nproc-per-node 4 $(BIN)/ddp

test: build
	# One package at a time: the end-to-end tests time heartbeats and grace
	# periods, which two packages racing for 2 cores would only blur.
	$(GO) test -p 1 -count=1 -timeout 15m ./...
	$(MAKE) fuzz

# go test ./... as a contributor without torch, sshd, Slurm, etcd or MPI
# runs it, as a user and without CI=true: it must pass, each test that
# needs a missing component skipping with a message that names the package
# (internal/testenv). Run as root; not part of `make test`, whose CI=true
# run fails on any missing component instead.
test-laptop:
	scripts/laptop-test.sh

# A short run of every fuzz target, as CI does: a count of inputs (about
# 15 s each here) rather than a duration, which Go 1.26's fuzzing
# coordinator can misreport as a failure when it ends mid-input
# ("context deadline exceeded" with no failing input; go.dev/issue/75804).
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./rendezvous/
	$(GO) test -run '^$$' -fuzz '^FuzzExpandHostlist$$' -fuzztime $(FUZZTIME) ./launcher/

lint:
	$(GO) vet ./...
	$(GO) install $(STATICCHECK)
	"$$($(GO) env GOPATH)/bin/staticcheck" ./...

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2000x ./rendezvous/

# gorun against torch 1.13 and OpenMPI on this host, in one run of 10 to 15
# minutes: every collective (gloo, mpi4py over shared memory and over TCP),
# the same between 2 and 4 emulated hosts on links shaped to 2 Gbit/s
# (bench/links.py: network namespaces and tc, root), the launcher (mpirun, torchrun, timed by hyperfine) and the store (torch's
# TCPStore server), and cluster scale (the store to 19K simulated ranks,
# rounds of 4,096 nodes, 64 and 128 sshd hosts against mpirun, 256 workers
# on a node against torchrun: bench/scale_*.py, tens of minutes, root for
# the sshd hosts); one markdown report with gorun's ratios and targets met
# or missed. Needs python3-torch, python3-mpi4py, openmpi-bin and hyperfine;
# it stops naming whatever is missing. Narrow it with BENCH_FLAGS, e.g.
# BENCH_FLAGS=--quick or BENCH_FLAGS='--sections collectives --ops allreduce'
# or BENCH_FLAGS='--sections scale --scale-parts store,rdzv'. With
# BENCH_FLAGS='--out FILE.md' the figures (bus bandwidth against size per
# collective, python3-matplotlib) go beside FILE.md.
bench-compare: build
	$(GO) build -o $(BIN)/ ./bench/storeserver ./bench/storesim ./bench/storefloor ./bench/wideworker ./bench/sshstamp
	/usr/bin/python3 bench/compare.py $(BENCH_FLAGS)

clean:
	rm -rf $(BIN)
