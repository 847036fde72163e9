#!/usr/bin/env bash
# The on-GPU acceptance check of gorun's CUDA and NCCL support (docs/gpu.md):
#
#   1. the NCCL backend: every collective on device tensors against the
#      same one on host tensors (bin/gpucheck), at world size 1, on every
#      GPU (--nproc-per-node gpu), and on 2 ranks (2 GPUs, or one GPU with
#      a distinct NCCL_HOSTID per rank, which NCCL takes for two hosts);
#      the watchdog aborting a collective one rank holds back from;
#   2. the TCP backend with device tensors, 4 ranks on one GPU; "auto"
#      falling back to TCP, and "nccl" failing, with one log line that
#      says why (ranks sharing a GPU, a missing libnccl);
#   3. allreduce-perf and torch's NCCL all_reduce on the same GPUs, and
#      host-device copies (bin/copy-perf) beside torch's (cudaMemcpy);
#   4. a PyTorch 2.x job under gorun, DDP training included: gloo on 4
#      ranks, NCCL on every GPU;
#   5. torch's TCPStore client against gorun's store, every operation;
#   6. Go workers under torch's torchrun (its libuv store), with NCCL
#      and on 4 ranks; gorun's rendezvous on torch's libuv server; and
#      the store's interop tests (bin/gpu/rendezvous.test) against it.
#
# It runs offline and needs no Go: only binaries built beforehand into
# bin/gpu (make gpu-bin), and a python3 with PyTorch 2.x for CUDA, whose
# NCCL wheel is where gorun finds libnccl.so.2 by default.
#
#   scripts/gpu-check.sh                      # logs in a new temporary folder
#   GPU_CHECK_LOGS=DIR scripts/gpu-check.sh   # logs, and summary.md, in DIR
#
# It prints one PASS or FAIL line per step, then the summary (also in
# summary.md), and exits 1 when a step failed, 2 when something it needs
# is missing.
set -u -o pipefail

cd "$(dirname "$0")/.."
BIN=${BIN:-bin/gpu}
PYTHON=${PYTHON:-python3}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
LOGS=${GPU_CHECK_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")}
mkdir -p "$LOGS"
SUMMARY=$LOGS/summary.md
export PYTHON_EXEC=$PYTHON # the interpreter gorun runs .py programs with
export PYTHONUNBUFFERED=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN} # a failing step's log says why NCCL failed

missing() {
	echo "gpu-check: $*" >&2
	exit 2
}

for b in gorun gpucheck allreduce-perf copy-perf rendezvous.test; do
	[[ -x $BIN/$b ]] || missing "$BIN/$b is missing: build it first (make gpu-bin)"
done
command -v "$PYTHON" >/dev/null || missing "no $PYTHON"
"$PYTHON" - <<'EOF' || missing "$PYTHON needs PyTorch 2.x with CUDA and a GPU"
import sys, torch
ok = int(torch.__version__.split(".")[0]) >= 2 and torch.cuda.is_available()
sys.exit(0 if ok else 1)
EOF
GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')

passed=0
failed=0
results=()

# record NAME OK SECONDS: counts and remembers a step's outcome.
record() {
	local name=$1 ok=$2 took=$3 line
	if ((ok)); then
		line="PASS  $name (${took}s)"
		passed=$((passed + 1))
	else
		line="FAIL  $name (${took}s): see $LOGS/$name.log"
		failed=$((failed + 1))
	fi
	results+=("$line")
	echo "$line"
}

# step NAME WANT PATTERN COUNT -- COMMAND...: runs COMMAND with its output
# in $LOGS/NAME.log. WANT is ok (exit status 0) or fail (not 0, but not a
# timeout either); PATTERN, unless empty, must then be in the log, on
# exactly COUNT lines unless COUNT is empty.
step() {
	local name=$1 want=$2 pattern=$3 count=$4
	shift 5
	local log=$LOGS/$name.log start=$SECONDS status ok=1
	echo "\$ $*" >"$log"
	timeout --kill-after=10 "$STEP_TIMEOUT" "$@" >>"$log" 2>&1
	status=$?
	case $want in
	ok) ((status == 0)) || ok=0 ;;
	fail) ((status != 0 && status != 124 && status != 137)) || ok=0 ;;
	esac
	if [[ -n $pattern ]]; then
		local n
		n=$(grep -c -- "$pattern" "$log")
		if [[ -z $count ]]; then
			((n > 0)) || ok=0
		else
			((n == count)) || ok=0
		fi
	fi
	echo "exit status $status" >>"$log"
	record "$name" "$ok" $((SECONDS - start))
}

echo "gpu-check: logs in $LOGS"
"$BIN/gorun" doctor >"$LOGS/doctor.log" 2>&1

# 1. NCCL at world size 1; "auto" choosing it; a rank on every GPU; two
# ranks (on one GPU, as two hosts to NCCL, over its sockets); the
# watchdog.
step 1-nccl-world-1 ok "checks passed on backend nccl" 1 -- \
	"$BIN/gorun" --nproc-per-node 1 "$BIN/gpucheck" -backend nccl -want nccl
step 1-auto-chooses-nccl ok "checks passed on backend nccl" 1 -- \
	"$BIN/gorun" --nproc-per-node 1 "$BIN/gpucheck" -want nccl -n 4096
step 1-nproc-per-node-gpu ok "gpucheck: backend nccl, $GPUS ranks" 1 -- \
	"$BIN/gorun" --nproc-per-node gpu "$BIN/gpucheck" -backend nccl -want nccl -n 4096
two_ranks=(env)
if ((GPUS < 2)); then
	# shellcheck disable=SC2016 # expanded by each worker's shell
	two_ranks=(env NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 sh -c 'NCCL_HOSTID=gpu-check-$LOCAL_RANK exec "$0" "$@"')
fi
step 1-nccl-2-ranks ok "checks passed on backend nccl" 1 -- \
	"$BIN/gorun" --nproc-per-node 2 "${two_ranks[@]}" "$BIN/gpucheck" -backend nccl -want nccl -n 65536
step 1-watchdog ok "PASS  watchdog" 1 -- \
	"$BIN/gorun" --nproc-per-node 2 "${two_ranks[@]}" "$BIN/gpucheck" -backend nccl -watchdog 10s

# 2. Device tensors over TCP, 4 ranks on one GPU; "auto" falls back to
# TCP with one warning per rank, "nccl" fails; a missing libnccl likewise.
step 2-tcp-4-ranks-1-gpu ok "checks passed on backend tcp" 1 -- \
	env CUDA_VISIBLE_DEVICES=0 "$BIN/gorun" --nproc-per-node 4 "$BIN/gpucheck" -backend tcp -want tcp -n 262144
step 2-auto-shared-gpu-falls-back ok "share one GPU of this host" 4 -- \
	env CUDA_VISIBLE_DEVICES=0 "$BIN/gorun" --nproc-per-node 4 "$BIN/gpucheck" -want tcp -n 4096
step 2-nccl-shared-gpu-fails fail "runtime: backend nccl on rank [0-9]*: ranks \[0 1 2 3\] share one GPU" "" -- \
	env CUDA_VISIBLE_DEVICES=0 "$BIN/gorun" --nproc-per-node 4 "$BIN/gpucheck" -backend nccl
step 2-auto-without-nccl-falls-back ok "NCCL is unavailable: using the TCP backend.*not found (GORUN_NCCL_LIBRARY): /nonexistent/libnccl.so.2" 1 -- \
	env GORUN_NCCL_LIBRARY=/nonexistent/libnccl.so.2 "$BIN/gorun" --nproc-per-node 1 "$BIN/gpucheck" -want tcp -n 4096
step 2-nccl-without-nccl-fails fail "no usable libnccl.so.2 (set GORUN_NCCL_LIBRARY to its path); not found (GORUN_NCCL_LIBRARY): /nonexistent/libnccl.so.2" "" -- \
	env GORUN_NCCL_LIBRARY=/nonexistent/libnccl.so.2 "$BIN/gorun" --nproc-per-node 1 "$BIN/gpucheck" -backend nccl

# 3. allreduce-perf on device buffers, both backends (busbw is 0 at world
# size 1 by nccl-tests' formula; algbw is what counts there), with torch's
# NCCL all_reduce on the same GPUs; copies, ours and torch's.
step 3-allreduce-perf-nccl ok "" "" -- \
	"$BIN/gorun" --nproc-per-node gpu "$BIN/allreduce-perf" -backend nccl -device cuda -b 8 -e 256M -f 4
step 3-torch-allreduce-nccl ok "Out of bounds values : 0 OK" 1 -- \
	"$BIN/gorun" --nproc-per-node gpu scripts/gpu_torch_perf.py --backend nccl -b 8 -e 256M -f 4 --copies
step 3-copy-perf ok "" "" -- \
	"$BIN/copy-perf"
step 3-allreduce-perf-tcp ok "" "" -- \
	env CUDA_VISIBLE_DEVICES=0 "$BIN/gorun" --nproc-per-node 4 "$BIN/allreduce-perf" -backend tcp -device cuda -b 8 -e 64M -f 4

# 4. PyTorch under gorun.
step 4-torch-gloo-4-ranks ok "torch job: 0 of the operations failed" 1 -- \
	"$BIN/gorun" --nproc-per-node 4 scripts/gpu_torch_job.py --backend gloo
step 4-torch-nccl-every-gpu ok "torch job: 0 of the operations failed" 1 -- \
	"$BIN/gorun" --nproc-per-node gpu scripts/gpu_torch_job.py --backend nccl

# 5. torch's TCPStore client against gorun's store.
step 5-torch-store-client ok "store ops: 0 failed" 2 -- \
	"$BIN/gorun" --nproc-per-node 2 scripts/gpu_store_ops.py

# 6. Our store client against torch's (libuv) server: Go workers under
# torchrun, and gorun's rendezvous.
step 6-go-worker-nccl-under-torchrun ok "checks passed on backend nccl" 1 -- \
	"$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 1 --no_python "$BIN/gpucheck" -backend nccl -want nccl -n 4096
step 6-go-workers-under-torchrun ok "checks passed on backend tcp" 1 -- \
	env CUDA_VISIBLE_DEVICES=0 "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 4 --no_python "$BIN/gpucheck" -backend tcp -want tcp -n 4096
step 6-gorun-rendezvous-on-torch-libuv ok "gpu_libuv_store: PASS" 1 -- \
	"$PYTHON" scripts/gpu_libuv_store.py --want-libuv -- "$BIN/gorun" --nproc-per-node 2 "$BIN/gpucheck" -backend tcp -want tcp -n 4096
# Our client's conformance suite on torch's server, and torch's client
# alike on both servers: the tests read their script from rendezvous/.
# shellcheck disable=SC2016 # expanded by that shell
step 6-store-tests-on-torch-libuv ok "serving, libuv: True" 2 -- \
	env CI=true GORUN_TORCH2_PYTHON="$PYTHON" sh -c 'cd rendezvous && exec "$0" "$@"' "$(cd "$BIN" && pwd)/rendezvous.test" \
	-test.run '^(TestOurClientAgainstTorch2Server|TestTorch2ClientSameOnBothServers)$' -test.v

{
	echo "## gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo
	echo '```'
	if command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	fi
	"$PYTHON" - <<'EOF'
import torch
try:
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
except Exception as e:  # a torch built without NCCL
    nccl = f"none ({e})"
print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", nccl)
EOF
	grep -h "gpucheck: backend" "$LOGS"/1-nccl-world-1.log "$LOGS"/1-nccl-2-ranks.log "$LOGS"/2-tcp-4-ranks-1-gpu.log | sed 's/^\[rank0\]: //'
	grep -h "aborted after" "$LOGS"/1-watchdog.log | sed 's/^\[rank[0-9]*\]: //'
	echo
	printf '%s\n' "${results[@]}"
	echo
	echo "$passed passed, $failed failed"
	echo '```'
	for part in 1-nccl-world-1 1-nccl-2-ranks 2-tcp-4-ranks-1-gpu 4-torch-gloo-4-ranks 4-torch-nccl-every-gpu; do
		echo
		echo "### $part"
		echo
		echo '```'
		grep -h -E '^(\[rank0\]: )?(PASS|FAIL|N/A) ' "$LOGS/$part.log" | sed 's/^\[rank0\]: //'
		echo '```'
	done
	echo
	echo "### gorun doctor"
	echo
	echo '```'
	cat "$LOGS/doctor.log"
	echo '```'
	for part in 3-allreduce-perf-nccl 3-torch-allreduce-nccl 3-allreduce-perf-tcp 3-copy-perf; do
		echo
		echo "### $part"
		echo
		echo '```'
		grep -h -v -E '^(\$ |exit status |[0-9:]+ [A-Z]{3} |\[rank[1-9][0-9]*\]: )' "$LOGS/$part.log" | sed 's/^\[rank0\]: //'
		echo '```'
	done
} >"$SUMMARY" 2>&1

echo
cat "$SUMMARY"
((failed == 0)) || exit 1
