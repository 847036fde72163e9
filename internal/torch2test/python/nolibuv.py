"""Debian builds torch 2.6 without libuv, and torch 2.x asks every TCPStore,
server and client, for libuv unless told otherwise, which then raises "use_libuv
was requested but PyTorch was build without libuv support". apply() gives
torch the default it lacks, in both places torch reads it:

* USE_LIBUV=0 for the paths that read the environment: init_process_group
  with worker rank 0 hosting the store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
  and torchrun's static rendezvous.
* use_libuv=False as the constructor's default where torch builds a
  TCPStore without saying: the agent-store client of env://
  (TORCHELASTIC_USE_AGENT_STORE=True, gorun's and torchrun's default) and,
  in torchrun, the c10d rendezvous backend and the dynamic rendezvous's
  shared store. torch.distributed.rendezvous is also a function's name on
  torch.distributed, hence sys.modules.

The store's wire protocol is the same with or without libuv.
"""

import os
import sys


def apply():
    os.environ.setdefault("USE_LIBUV", "0")
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if not dist.is_available() or getattr(dist.TCPStore, "_gorun_no_libuv", False):
        return
    import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c10d
    import torch.distributed.elastic.rendezvous.dynamic_rendezvous  # noqa: F401 (dist.TCPStore)
    import torch.distributed.rendezvous  # noqa: F401

    tcp_store = dist.TCPStore

    def without_libuv(*args, **kwargs):
        kwargs.setdefault("use_libuv", False)
        return tcp_store(*args, **kwargs)

    without_libuv._gorun_no_libuv = True
    dist.TCPStore = without_libuv
    sys.modules["torch.distributed.rendezvous"].TCPStore = without_libuv
    c10d.TCPStore = without_libuv
