#!/usr/bin/env bash
# `go test ./...` as a contributor runs it on a laptop: as a user, not
# root, without torch, sshd, Slurm, munge, etcd or MPI, and without
# CI=true. It proves that such a run passes, every test that needs what is
# missing skipping with a message that names it (internal/testenv's rule).
#
# Run it as root (make test-laptop): in a mount namespace of its own it
# hides those components under empty files and folders bound over them,
# copies the working tree into a temporary folder, and runs the tests
# there as the user nobody, with a clean environment, the Go toolchain of
# PATH and the module cache read-only (no network: every module must be in
# the cache already). Nothing outside its temporary folders changes, and
# the machine's own view is untouched.
#
#   scripts/laptop-test.sh                     # every package
#   scripts/laptop-test.sh ./launcher/ -run X  # go test's arguments
#
# It prints each package's result, the number of tests run and skipped,
# and every skip's reason, and exits non-zero when a test failed or a
# skip does not say what it needs. The build cache is kept between runs
# in $TMPDIR/gorun-laptop-test-gocache.
set -u -o pipefail

if (( EUID != 0 )); then
	echo "laptop-test: run it as root: it hides components in a mount namespace of its own, then drops to a user" >&2
	exit 2
fi
if [[ -z ${LAPTOP_TEST_NAMESPACE:-} ]]; then
	exec unshare --mount --propagation private env LAPTOP_TEST_NAMESPACE=1 "$0" "$@"
fi

cd "$(dirname "$0")/.."
args=("$@")
(( ${#args[@]} )) || args=(./...)
user=nobody
uid=$(id -u "$user") gid=$(id -g "$user")
go=$(command -v go) || { echo "laptop-test: no go in PATH" >&2; exit 2; }
tmp=${TMPDIR:-/tmp}
# Short paths: a Unix socket's path holds 107 bytes, and the tests' own
# temporary folders go below $work/t.
work=$(mktemp -d "$tmp/glt.XXXXXX")
# The module cache is bound below $work: unbind it before removing $work,
# and never cross into another file system while removing.
trap 'umount "$work/modcache" 2>/dev/null; rm -rf --one-file-system "$work"' EXIT
chmod 755 "$work"
log=$(mktemp "$tmp/gorun-laptop-test.XXXXXX.json")

# Hiding: an empty folder over a package, an empty file that is no
# program over a program, in this namespace only.
mkdir "$work/empty"
: >"$work/empty-file"
chmod 644 "$work/empty-file"
hide() {
	local path
	path=$(readlink -f "$1")
	if [[ -d $path ]]; then
		mount --bind "$work/empty" "$path"
	else
		mount --bind "$work/empty-file" "$path"
	fi && echo "hidden: $1"
}
for py in /usr/bin/python3 ${GORUN_TEST_PYTHON:-}; do
	while read -r dir; do
		[[ -d $dir ]] && hide "$dir"
	done < <("$py" -c 'import importlib.util as u, os
for m in ("torch", "functorch", "torchgen"):
    s = u.find_spec(m)
    if s and s.origin: print(os.path.dirname(s.origin))' 2>/dev/null)
done
programs=(torchrun sshd slurmctld slurmd slurmstepd slurmdbd srun sbatch salloc scontrol sinfo squeue scancel sacct
	munged mungekey etcd etcdctl mpirun mpiexec orterun)
declare -A seen
for name in "${programs[@]}"; do
	for dir in ${PATH//:/ } /usr/sbin /sbin /usr/bin /bin; do
		path=$dir/$name
		[[ -f $path ]] || continue
		real=$(readlink -f "$path")
		[[ -z ${seen[$real]:-} ]] || continue
		seen[$real]=1
		hide "$path"
	done
done
if /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
	echo "laptop-test: torch is still importable; hiding it failed" >&2
	exit 2
fi

# The user's side: the tree, a home, a temporary folder, the caches.
mkdir -p "$work/src" "$work/home" "$work/t" "$work/gopath" "$work/modcache" "$tmp/gorun-laptop-test-gocache"
git ls-files -z --cached --others --exclude-standard |
	tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$work/src"
chown -R "$uid:$gid" "$work/src" "$work/home" "$work/t" "$work/gopath" "$tmp/gorun-laptop-test-gocache"
mount --bind "$("$go" env GOMODCACHE)" "$work/modcache"
mount -o remount,bind,ro "$work/modcache"

echo "go test ${args[*]} as $user (uid $uid), CI unset; the whole suite takes 10 minutes or more"
(
	cd "$work/src" &&
		setpriv --reuid="$uid" --regid="$gid" --clear-groups --inh-caps=-all \
			env -i PATH="$(dirname "$go"):/usr/local/bin:/usr/bin:/bin" HOME="$work/home" USER="$user" LANG=C.UTF-8 \
			TMPDIR="$work/t" GOCACHE="$tmp/gorun-laptop-test-gocache" GOPATH="$work/gopath" GOMODCACHE="$work/modcache" \
			GOFLAGS="-mod=readonly -buildvcs=false" GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local \
			"$go" test -json -p 1 -count=1 -timeout 30m "${args[@]}"
) >"$log" 2>&1
status=$?

# The summary: go test's verdict, and whether every skip says what it
# needs.
/usr/bin/python3 - "$log" "$status" <<'EOF'
import collections, json, re, sys

log, status = sys.argv[1], int(sys.argv[2])
out = collections.defaultdict(list)
result, packages, other = {}, [], []
for line in open(log, errors="replace"):
    try:
        e = json.loads(line)
    except ValueError:
        other.append(line.rstrip())
        continue
    key = (e.get("Package", ""), e.get("Test"))
    if e["Action"] == "output":
        out[key].append(e["Output"])
    elif e["Action"] in ("pass", "fail", "skip"):
        if e.get("Test"):
            result[key] = e["Action"]
        else:
            packages.append((e["Action"], e["Package"], e.get("Elapsed", 0)))

for action, pkg, elapsed in packages:
    print(f"{action.upper():5} {pkg} {elapsed:.1f}s")
for line in other:
    print(line)
count = collections.Counter(result.values())
print(f"\ntests: {count['pass']} passed, {count['skip']} skipped, {count['fail']} failed")

reasons, silent = collections.Counter(), []
for key, r in sorted(result.items(), key=lambda kv: (kv[0][0], kv[0][1])):
    if r == "fail":
        print(f"FAILED {key[0]} {key[1]}:\n" + "".join(out[key][-30:]))
    if r != "skip":
        continue
    # A parent skipped because all its subtests did has no reason of its own.
    children = [k for k in result if k[0] == key[0] and k[1].startswith(key[1] + "/")]
    if children and all(result[k] == "skip" for k in children):
        continue
    text = "".join(out[key])
    m = re.search(r"testenv: needs .*?(?:\(apt-get install [^)]*\)|(?=:)|$)", text, re.M)
    if m:
        reasons[m.group(0)] += 1
    elif "race detector" in text:
        reasons["not counted under the race detector"] += 1
    else:
        silent.append(f"{key[0]} {key[1]}: " + text.strip().replace("\n", " | ")[-300:])
print("\nskips, by what they need:")
for reason, n in reasons.most_common():
    print(f"{n:5}  {reason}")
if silent:
    print("\nskips that do not say what they need:")
    for s in silent:
        print("  " + s)
print(f"\ngo test exit status {status}; the full log: {log}")
sys.exit(1 if status or silent or count["fail"] else 0)
EOF
