"""The device's measured peaks, the denominators of the benchmarks' TFLOP/s and bandwidth fractions:
a square matmul in f32 (TF32 off: CUDA cores, as dg's f32 kernels) and in bf16 (tensor cores),
and a device-to-device copy (bytes read + bytes written per second).

    python bench/torch_peak.py --device cuda
    python bench/torch_peak.py --device cpu --size 1024 --copy-mib 64
"""

import argparse
import time

import torch

from torch_model import sync, where


def best_seconds(fn, iters: int, repeats: int, device: torch.device) -> float:
    """Best over `repeats` of the mean seconds per call of `iters` back-to-back calls."""
    fn()  # warm-up (kernel selection, allocation)
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", type=int, default=8192, help="n of the n×n×n matmuls")
    parser.add_argument("--copy-mib", type=int, default=4096, help="size of the copied buffer")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    n = args.size
    print(f"torch {torch.__version__} {where(dev, args.threads)}")
    for name, dtype, iters in (("f32 (TF32 off)", torch.float32, 10), ("bf16", torch.bfloat16, 50)):
        a = torch.randn(n, n, device=dev).to(dtype)
        b = torch.randn(n, n, device=dev).to(dtype)
        out = torch.empty(n, n, device=dev, dtype=dtype)
        s = best_seconds(lambda: torch.matmul(a, b, out=out), iters, args.repeats, dev)
        print(f"peak matmul {name} {n}x{n}x{n}: {2 * n**3 / s / 1e12:.1f} TFLOP/s ({s * 1e3:.3f} ms)")
        del a, b, out
    elems = args.copy_mib * (1 << 20) // 4
    src = torch.empty(elems, device=dev, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    s = best_seconds(lambda: dst.copy_(src), 10, args.repeats, dev)
    print(f"peak copy {args.copy_mib} MiB: {2 * src.numel() * 4 / s / 1e9:.0f} GB/s (read + write, {s * 1e3:.3f} ms)")


if __name__ == "__main__":
    main()
