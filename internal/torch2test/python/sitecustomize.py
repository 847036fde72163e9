# Every Python process whose PYTHONPATH names this folder, a worker under
# gorun or torchrun included, gets torch 2.6's TCPStore without libuv (see
# nolibuv.py). It shadows Debian's sitecustomize, which only installs
# apport's hook, absent from the root.
import nolibuv

nolibuv.apply()
