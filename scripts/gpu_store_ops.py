"""torch's own TCPStore client against gorun's store: every operation the
installed torch's Python binding has. Part (5) of scripts/gpu-check.sh:

    gorun --nproc-per-node 2 scripts/gpu_store_ops.py

Every rank connects to the store gorun hosts for its workers (MASTER_ADDR,
MASTER_PORT), as torch's env:// initialisation does, and runs the
operations under keys of its own; the two ranks also wait for each
other's keys. Each rank prints one line per operation, PASS, FAIL or N/A
(this torch's binding lacks it), and exits 1 when one failed.
"""

import datetime
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


class Unsupported(Exception):
    """This torch's binding lacks the operation."""


def connect():
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=30))


def key(name):
    return f"gpucheck/rank{rank}/{name}"


def expect(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def needs(store, *methods):
    for m in methods:
        if not hasattr(store, m):
            raise Unsupported(f"torch {torch.__version__} has no TCPStore.{m}")


def times_out(fn):
    """Runs fn, which must fail with a timeout."""
    start = time.monotonic()
    try:
        fn()
    except Exception as e:  # torch raises RuntimeError or DistStoreError
        if "timeout" not in str(e).lower() and "timed out" not in str(e).lower():
            raise AssertionError(f"failed, but not with a timeout: {e}") from e
        return time.monotonic() - start
    raise AssertionError("did not time out")


def checks(s):
    def set_get():
        s.set(key("a"), "value")
        expect("get", s.get(key("a")), b"value")
        s.set(key("bin"), b"\x00\xff\x10")
        expect("get bytes", s.get(key("bin")), b"\x00\xff\x10")
        s.set(key("a"), "")
        expect("get empty", s.get(key("a")), b"")

    def add():
        expect("add", [s.add(key("n"), 5), s.add(key("n"), -2)], [5, 3])
        expect("get after add", s.get(key("n")), b"3")

    def compare_set():
        expect("on a missing key", s.compare_set(key("cs"), "", "first"), b"first")
        expect("matching", s.compare_set(key("cs"), "first", "second"), b"second")
        expect("stale", s.compare_set(key("cs"), "stale", "x"), b"second")
        expect("get", s.get(key("cs")), b"second")

    def check():
        needs(s, "check")
        s.set(key("c"), "1")
        expect("check present", s.check([key("c")]), True)
        expect("check missing", s.check([key("c"), key("missing")]), False)

    def wait():
        s.set(key("w"), "1")
        s.wait([key("w")])
        took = times_out(lambda: s.wait([key("never")], datetime.timedelta(milliseconds=300)))
        if took > 10:
            raise AssertionError(f"a 300 ms wait took {took:.1f} s")
        # The connection still works after a wait that timed out.
        s.set(key("after"), "ok")
        expect("get after a timed-out wait", s.get(key("after")), b"ok")

    def wait_for_peer():
        if world < 2:
            raise Unsupported("needs two ranks")
        peer = (rank + 1) % world
        s.set(f"gpucheck/hello/{rank}", str(rank))
        s.wait([f"gpucheck/hello/{peer}"], datetime.timedelta(seconds=30))
        expect("peer's key", s.get(f"gpucheck/hello/{peer}"), str(peer).encode())

    def delete_key():
        s.set(key("d"), "1")
        expect("delete", [s.delete_key(key("d")), s.delete_key(key("d"))], [True, False])

    def num_keys():
        before = s.num_keys()
        s.set(key("nk1"), "1")
        s.set(key("nk2"), "2")
        s.set(key("nk1"), "again")
        after = s.num_keys()
        # The other rank may add keys meanwhile: at least ours count.
        if after - before < 2:
            raise AssertionError(f"num_keys went from {before} to {after} after two new keys")

    def get_timeout():
        s.set_timeout(datetime.timedelta(milliseconds=300))
        try:
            times_out(lambda: s.get(key("missing")))
        finally:
            s.set_timeout(datetime.timedelta(seconds=30))
        s.set(key("t"), "ok")
        expect("get after a timed-out get", s.get(key("t")), b"ok")

    def append():
        needs(s, "append")
        s.append(key("ap"), "ab")
        s.append(key("ap"), "cd")
        expect("appended", s.get(key("ap")), b"abcd")

    def multi():
        needs(s, "multi_set", "multi_get")
        s.multi_set([key("m1"), key("m2")], ["one", b"\x02"])
        expect("multi_get", s.multi_get([key("m2"), key("m1")]), [b"\x02", b"one"])

    def queue():
        needs(s, "queue_push", "queue_pop", "queue_len")
        s.queue_push(key("q"), "first")
        s.queue_push(key("q"), "second")
        expect("queue_len", s.queue_len(key("q")), 2)
        expect("queue_pop", [s.queue_pop(key("q")), s.queue_pop(key("q"))], [b"first", b"second"])
        expect("queue_len after", s.queue_len(key("q")), 0)

    def list_keys():
        needs(s, "list_keys")
        s.set(key("listed"), "1")
        keys = [k.decode() if isinstance(k, bytes) else k for k in s.list_keys()]
        if not any(k.endswith(key("listed")) for k in keys):
            raise AssertionError(f"{key('listed')} is not among the {len(keys)} keys listed")

    def clone():
        needs(s, "clone")
        c = s.clone()
        c.set(key("clone"), "from the clone")
        expect("get through the original", s.get(key("clone")), b"from the clone")

    def second_client():
        other = connect()
        other.set(key("other"), "x")
        expect("get through the first client", s.get(key("other")), b"x")

    return [
        ("set/get", set_get), ("add", add), ("compare_set", compare_set), ("check", check),
        ("wait", wait), ("wait for the other rank", wait_for_peer), ("delete_key", delete_key),
        ("num_keys", num_keys), ("get timeout", get_timeout), ("append", append),
        ("multi_set/multi_get", multi), ("queue_push/queue_pop/queue_len", queue),
        ("list_keys", list_keys), ("clone", clone), ("a second client", second_client),
    ]


def main():
    s = connect()
    print(f"torch {torch.__version__}: TCPStore client of {host}:{port}", flush=True)
    failed = 0
    for name, op in checks(s):
        try:
            op()
            print(f"PASS  {name}", flush=True)
        except Unsupported as e:
            print(f"N/A   {name}  {e}", flush=True)
        except Exception as e:  # the operation or its check failed
            failed += 1
            traceback.print_exc()
            print(f"FAIL  {name}  {type(e).__name__}: {e}", flush=True)
    print(f"store ops: {failed} failed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
