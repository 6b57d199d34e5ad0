"""What the course's checks cost a student's compiled code: each check calls ``torch._dynamo.reset()``.

``alibi_ref.course.checks._uncompiled`` empties dynamo's caches before every check, so that nothing
compiled before a check runs inside it unwatched. The student's next compiled call then compiles
again. This times that on the inputs' device (CUDA where there is one): FlexAttention with ALiBi
(``impl="flex"``, notebook 07's subject), its first call, a call once compiled, the reset, and the
call after it (inductor's kernels are cached on disk, so this is dynamo tracing again, not a cold
compile).

    python benchmarks/dynamo_reset_cost.py [--n 1024]
"""

import argparse
import time

import torch

from alibi_ref import alibi_attention, get_slopes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024, help="sequence length")
    n = parser.parse_args().n
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 64, device=device, generator=gen).to(dtype) for _ in range(3))  # (B, H, N, d)
    slopes = torch.tensor(get_slopes(8), device=device)

    def seconds(fn) -> float:
        torch.cuda.synchronize() if device.type == "cuda" else None
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize() if device.type == "cuda" else None
        return time.perf_counter() - start

    def flex():
        return alibi_attention(q, k, v, slopes, causal=True, impl="flex")

    first, compiled = seconds(flex), seconds(flex)
    reset = seconds(torch._dynamo.reset)
    after = seconds(flex)
    print(f"{device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}), torch {torch.__version__}, "
          f"FlexAttention with ALiBi, causal, (1, 8, {n}, 64) {str(dtype).removeprefix('torch.')}")
    for what, s in (("first call (compiles)", first), ("a compiled call", compiled),
                    ("torch._dynamo.reset()", reset), ("the call after the reset", after)):
        print(f"  {what:<26} {1e3 * s:>10.1f} ms")


if __name__ == "__main__":
    main()
