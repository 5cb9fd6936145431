#!/usr/bin/env python3
"""Memory pressure on demand: pushes a process's private writable memory to swap.

Every INTERVAL seconds, for DURATION seconds (or until the process exits),
each private writable mapping of PID is advised MADV_PAGEOUT with
process_madvise(2), which is what reclaim does to a host under memory
pressure. Needs root (CAP_SYS_NICE) and swap. Used beside `hourglass bench`
to measure what the instance reset costs when the pages it resets are in
swap (BENCHMARKS.md, round 24):

    python3 bench/pageout.py PID [--interval 0.5] [--duration 60]

Prints one line at the end: the rounds and the bytes advised.
"""

import argparse
import ctypes
import os
import sys
import time

SYS_PIDFD_OPEN = 434  # x86_64 and aarch64 share these numbers
SYS_PROCESS_MADVISE = 440
MADV_PAGEOUT = 21


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def private_writable(pid):
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if fields[1].startswith("rw") and fields[1].endswith("p"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                yield start, end - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pid", type=int)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=60.0)
    args = parser.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pidfd = libc.syscall(SYS_PIDFD_OPEN, args.pid, 0)
    if pidfd < 0:
        sys.exit(f"error: pidfd_open({args.pid}): {os.strerror(ctypes.get_errno())}")
    rounds = advised = 0
    end = time.monotonic() + args.duration
    while time.monotonic() < end:
        try:
            ranges = list(private_writable(args.pid))
        except (FileNotFoundError, ProcessLookupError):
            break
        for start, length in ranges:
            iov = IoVec(start, length)
            n = libc.syscall(SYS_PROCESS_MADVISE, pidfd, ctypes.byref(iov), 1, MADV_PAGEOUT, 0)
            if n > 0:
                advised += n
        rounds += 1
        time.sleep(args.interval)
    print(f"pageout: {rounds} rounds, {advised / 2**20:.0f} MiB advised")


if __name__ == "__main__":
    main()
