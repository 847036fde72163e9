# A worker that guards its step with torch's file-timer watchdog, as a
# torchrun job does: FileTimerClient on TORCHELASTIC_TIMER_FILE, then
# timer.expires(after=...). Only API that torch 1.13 and 2.x share.
#
#   torch_filetimer.py MODE [SIGNAL]
#
# MODE overstay: rank 1 sleeps far past its 1 s scope, on every attempt;
# overstay-first: only on the first attempt; in-time: every rank releases
# its scope at once and then outlives the scope's expiry. SIGNAL (a name)
# is what the watchdog should kill with; torch's default is SIGKILL.
import os
import signal
import stat
import sys
import time

import torch.distributed.elastic.timer as timer

mode = sys.argv[1]
path = os.environ["TORCHELASTIC_TIMER_FILE"]
rank = int(os.environ["RANK"])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {rank} timer file {path} fifo={stat.S_ISFIFO(os.stat(path).st_mode)}", flush=True)

if len(sys.argv) > 2:
    timer.configure(timer.FileTimerClient(path, signal=signal.Signals[sys.argv[2]]))
else:
    timer.configure(timer.FileTimerClient(path))

overstay = rank == 1 and (mode == "overstay" or (mode == "overstay-first" and restart == 0))
with timer.expires(after=1, scope="train_step"):
    if overstay:
        print(f"rank {rank} overstaying at {time.time():.3f}", flush=True)
        time.sleep(60)
if mode == "in-time":
    time.sleep(2)  # past the released scope's expiry
print(f"rank {rank} done restart={restart}", flush=True)
