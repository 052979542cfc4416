#!/usr/bin/env python3
"""gpuproc: a CUDA process for torpor's real-host GPU tests.

It calls the CUDA driver API through ctypes, so it needs only python3 and
the NVIDIA driver's libcuda.so.1: no CUDA toolkit, no pip packages.

  gpuproc.py probe                       print the device count, exit 0
  gpuproc.py worker --control DIR [--data-mib N] [--device D]
      a lease worker: holds N MiB of data (filled with a pattern), speaks
      torpor's file protocol for reservations (DIR/reserve ->
      DIR/reserved, see gpu/nvidia/worker.go) and checks its data on
      request (DIR/verify "<seq>" -> DIR/verified "<seq> ok|bad ...")
  gpuproc.py child --mib N [--device D]
      a job's child: holds N MiB until it is killed

Each prints "ready <pid>" on stdout once its memory is allocated.
"""
import argparse
import ctypes
import os
import sys
import time

CHUNK_MIB = 64
CHUNK = CHUNK_MIB << 20
CUDA_ERROR_OUT_OF_MEMORY = 2


class CudaError(Exception):
    def __init__(self, rc, what):
        super().__init__(f"{what}: CUDA error {rc}")
        self.rc = rc


class Cuda:
    def __init__(self, device):
        lib = None
        err = None
        for name in ("libcuda.so.1", "libcuda.so"):
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError as e:
                err = e
        if lib is None:
            sys.exit(f"gpuproc: cannot load libcuda.so.1 (NVIDIA driver): {err}")
        self.lib = lib
        u64, sz = ctypes.c_uint64, ctypes.c_size_t
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), sz]
        lib.cuMemFree_v2.argtypes = [u64]
        lib.cuMemsetD32_v2.argtypes = [u64, ctypes.c_uint, sz]
        lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, u64, sz]
        self.check(lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    @staticmethod
    def check(rc, what):
        if rc != 0:
            raise CudaError(rc, what)

    def alloc(self, size, fill):
        ptr = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), size), "cuMemAlloc")
        self.check(self.lib.cuMemsetD32_v2(ptr.value, fill, size // 4), "cuMemsetD32")
        return ptr.value

    def free(self, ptr):
        self.check(self.lib.cuMemFree_v2(ptr), "cuMemFree")

    def sync(self):
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def word(self, ptr):
        buf = ctypes.c_uint32()
        self.check(self.lib.cuMemcpyDtoH_v2(ctypes.byref(buf), ptr, 4), "cuMemcpyDtoH")
        return buf.value


def device_count():
    cu = Cuda(0)
    n = ctypes.c_int()
    cu.check(cu.lib.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
    return n.value


def ready():
    print(f"ready {os.getpid()}", flush=True)


def read(path):
    try:
        with open(path) as f:
            return f.read().split()
    except FileNotFoundError:
        return []


def answer(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.rename(tmp, path)


def pattern(i):
    return 0xA5000000 + i


def worker(args):
    cu = Cuda(args.device)
    data = [cu.alloc(CHUNK, pattern(i)) for i in range(args.data_mib // CHUNK_MIB)]
    pool = []
    cu.sync()
    os.makedirs(args.control, exist_ok=True)
    ready()
    last_reserve, last_verify = None, None
    while True:
        f = read(os.path.join(args.control, "reserve"))
        if len(f) == 2 and f[0] != last_reserve:
            last_reserve = f[0]
            mib = int(f[1])
            want = max(0, mib - args.data_mib) // CHUNK_MIB
            try:
                while len(pool) > want:
                    cu.free(pool.pop())
                while len(pool) < want:
                    pool.append(cu.alloc(CHUNK, 0))
                cu.sync()
                answer(os.path.join(args.control, "reserved"), f"{f[0]} ok {mib}")
            except CudaError as e:
                verdict = "oom" if e.rc == CUDA_ERROR_OUT_OF_MEMORY else "error"
                answer(os.path.join(args.control, "reserved"), f"{f[0]} {verdict} {e}")
        v = read(os.path.join(args.control, "verify"))
        if len(v) == 1 and v[0] != last_verify:
            last_verify = v[0]
            bad = [i for i, p in enumerate(data) if cu.word(p) != pattern(i)]
            verdict = "ok" if not bad else f"bad {len(bad)} chunks"
            answer(os.path.join(args.control, "verified"), f"{v[0]} {verdict}")
        time.sleep(0.02)


def child(args):
    cu = Cuda(args.device)
    keep = [cu.alloc(CHUNK, 0x5A5A5A5A) for _ in range(max(1, args.mib // CHUNK_MIB))]
    cu.sync()
    ready()
    while keep:
        time.sleep(1)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    sub.add_parser("probe")
    w = sub.add_parser("worker")
    w.add_argument("--control", required=True)
    w.add_argument("--data-mib", type=int, default=0)
    w.add_argument("--device", type=int, default=0)
    c = sub.add_parser("child")
    c.add_argument("--mib", type=int, required=True)
    c.add_argument("--device", type=int, default=0)
    args = p.parse_args()
    if args.mode == "probe":
        print(f"ok {device_count()} devices")
    elif args.mode == "worker":
        worker(args)
    else:
        child(args)


if __name__ == "__main__":
    main()
