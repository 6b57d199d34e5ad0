"""ALiBi fused into the attention kernel on the CPU: the bias computed where the scores are.

Every other CPU path hands torch's flash kernel the bias as a float mask, which the kernel reads from
memory and adds in a pass of its own over each block of scores: on an Intel Xeon that alone cost more
than a path may cost over plain attention (figures: docs/performance.md, "The fused CPU kernel"). This
kernel (``csrc/fused_alibi.cpp``, C++, built with torch's extension builder) is flash attention
(Dao et al., 2022) with the bias in its own score pass:

    s_ij = scale q_i . k_j - m_h |p_i - p_j|        (p_i = i + k_len - q_len: queries end at the keys)

added as the row's maximum is taken, so nothing is read for it. Each block's scores come from one BLAS
product (the BLAS torch links and exports: MKL on x86), the softmax runs online block by block, and the
backward pass recomputes each block's weights from the forward's log-sum-exp and returns dq, dk, dv and
the slopes' gradient (learned slopes need no second path). Causal blocks past the diagonal are never
computed; a sliding window, or each head's reach (``alibi_ref.reach``), skips the blocks outside it.
float32 and float64 on the CPU, forward and backward.

bfloat16, forward only (a call that takes a gradient goes to the other paths), where oneDNN's brgemm runs
(AVX512-BF16 or AMX; ``takes_bfloat16()`` in the kernel says): the products take bfloat16 into float32, as
torch's own flash kernel does, the softmax runs in float32, and the weights are rounded to bfloat16 for the
product with v, so the output rounds as bfloat16 SDPA's. brgemm reads k^T and v packed in pairs of rows
(VNNI), which the kernel writes once per call. A CPU without them (AVX2) runs bfloat16's products in float32,
each block of q, k and v widened to float32 as it is read (``Widened`` in the C++; the weights stay float32, as
bfloat16 SDPA's do there). Other dtypes, dropout, padding and positions take the other paths.

Where it runs: ``alibi_attention(..., impl="fused")`` builds the kernel if needed (a compile of some
seconds, once per machine: the binary is cached under ``kernel_dir()``); ``impl="auto"`` takes it on the CPU
only once it is built, so that no call stops to compile: ``python -m alibi_ref build-kernel`` (``make`` runs
it) builds it. A machine without a C++ compiler simply goes without: ``available()`` says whether it is
there, and ALIBI_REF_FUSED=0 in the environment turns it off for "auto".
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import sys
from pathlib import Path

import torch

from ._backend import grad_taken

SOURCE = Path(__file__).parent / "csrc" / "fused_alibi.cpp"
# -march=native: the binary is built for the machine that runs it (its name carries the CPU's model and
# features); 512-bit vectors where the CPU has them, for the score passes; -fno-math-errno lets them vectorise
CFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fno-math-errno", "-fopenmp"]
DTYPES = (torch.float32, torch.float64)  # forward and backward; bfloat16 forward only
# bfloat16's products read k and v packed 16, 32, 48 or 64 columns at a time (oneDNN's brgemm)
BF16_HEAD_MULTIPLE = 16


def kernel_dir() -> Path:
    """Where built kernels are cached: $ALIBI_REF_KERNELS, or ~/.cache/alibi_ref/kernels."""
    return Path(os.environ.get("ALIBI_REF_KERNELS") or Path.home() / ".cache" / "alibi_ref" / "kernels")


def _cpu() -> str:
    """The CPU's model and features, which -march=native builds for."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "".join(sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))}))
    except OSError:
        return platform.processor() + platform.machine()


@functools.cache
def _name() -> str:
    """The module's name: the source, flags, torch, Python and CPU it is built for, hashed."""
    stamp = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(CFLAGS).encode(), torch.__version__.encode(),
                 sys.version.encode(), _cpu().encode()):
        stamp.update(part)
    return f"fused_alibi_{stamp.hexdigest()[:16]}"


def _binary() -> Path:
    return kernel_dir() / _name() / f"{_name()}.so"


@functools.cache
def _loaded():
    """The built kernel's module, imported; None where it is not built (nothing is compiled here)."""
    path = _binary()
    if not path.exists():
        return None
    loader = importlib.machinery.ExtensionFileLoader(_name(), str(path))
    spec = importlib.util.spec_from_file_location(_name(), path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def available() -> bool:
    """Whether the kernel is built for this machine, and not turned off with ALIBI_REF_FUSED=0: whether
    ``impl="auto"`` may take it."""
    if os.environ.get("ALIBI_REF_FUSED") == "0":
        return False
    try:
        return _loaded() is not None
    except ImportError:  # a binary that no longer loads (a changed torch would have changed its name)
        return False


def build(verbose: bool = False):
    """Build the kernel for this machine (a compile of some seconds; nothing to do where it is built) and return
    its module.

    Raises RuntimeError, with the compiler's complaint, where it cannot be built."""
    if _binary().exists():
        return _loaded()
    from torch.utils.cpp_extension import load

    directory = kernel_dir() / _name()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        load(_name(), [str(SOURCE)], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"], build_directory=str(directory),
             verbose=verbose)
    except (RuntimeError, OSError, ImportError) as failed:
        raise RuntimeError(f"could not build the fused ALiBi kernel in {directory}: {failed}") from failed
    _loaded.cache_clear()
    if not _binary().exists():
        raise RuntimeError(f"built the fused ALiBi kernel but found no {_binary()}")
    return _loaded()


def why_not_fused(q, v, dropout_p: float = 0.0, positional: bool = False, return_weights: bool = False,
                  grad: bool = False) -> str | None:
    """Why the kernel cannot take this call, or None where it can (built or not). ``grad``: whether a gradient
    will be taken through it."""
    if not (isinstance(q, torch.Tensor) and q.device.type == "cpu"):
        return "it runs on the CPU, on torch tensors"
    if q.dtype == torch.bfloat16:
        why = _why_not_bfloat16(q, grad)
        if why is not None:
            return why
    elif q.dtype not in DTYPES:
        return f"it computes in float32 and float64 (bfloat16 forward only), got {q.dtype}"
    if v.shape[-1] != q.shape[-1]:
        return f"it needs v's head size equal to q's, got {v.shape[-1]} and {q.shape[-1]}"
    if dropout_p:
        return "it has no attention dropout"
    if positional:
        return "it takes no key padding or positions"
    if return_weights:
        return "it never holds the weights"
    if torch.compiler.is_compiling():
        return "torch.compile cannot trace into it"
    return None


def _why_not_bfloat16(q, grad: bool) -> str | None:
    if grad:
        return "it takes bfloat16 forward only, and this call takes a gradient"
    if q.shape[-1] % BF16_HEAD_MULTIPLE and not bfloat16_as_float32():
        return f"bfloat16 needs a head size that is a multiple of {BF16_HEAD_MULTIPLE}, got {q.shape[-1]}"
    return None


def takes_bfloat16() -> bool:
    """Whether the built kernel runs bfloat16's products in bfloat16 here (oneDNN's brgemm runs on this CPU);
    False where it is not built."""
    kernel = _loaded() if available() else None
    return kernel is not None and kernel.takes_bfloat16()


def bfloat16_as_float32() -> bool:
    """Whether bfloat16's products run here in float32: the kernel is built, and oneDNN's brgemm takes no
    bfloat16 on this CPU (AVX2 without AVX512-BF16)."""
    return available() and not takes_bfloat16()


def fused_alibi_attention(q, k, v, slopes, scale: float, causal: bool, groups: int, window=None):
    """ALiBi attention through the fused kernel, built first if it is not: q (..., H, i, d), k and v
    (..., H_kv, j, d), slopes (H,) in q's dtype. ``window`` (left, right) or None; each head's reach narrows
    it where that holds (``alibi_ref.reach``). Returns (..., H, i, d)."""
    kernel = _loaded() or build()
    lead = q.shape[:-3]
    if q.ndim != 4:
        q, k, v = (x.reshape(-1, *x.shape[-3:]) for x in (q, k, v))  # (B, H, n, d): a view where it can be
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = map(_unit_stride, (q, k, v))
    windows = head_windows(q, k, slopes, scale, causal, groups, window, kernel)
    if grad_taken(q, k, v, slopes):
        out = FusedALiBi.apply(q, k, v, slopes, windows, float(scale), causal, kernel)  # (B, H, i, d)
    else:  # no graph to record: the kernel alone (each torch call before it costs microseconds)
        out = kernel.forward(q, k, v, slopes, windows, float(scale), causal)[0]
    return out if len(lead) == 1 else out.reshape(*lead, *out.shape[-3:])


def head_windows(q, k, slopes, scale: float, causal: bool, groups: int, window, kernel=None):
    """(H, 2): each query head's (left, right), -1 for no limit: ``window``, narrowed to the head's reach
    where it holds (every query sees its own position, q_len <= k_len; slopes that take no gradient).
    ``kernel``: the built kernel, whose ``longest_rows`` the reach's bound reads q and k with (q and k with
    a unit stride along d)."""
    left, right = window or (-1, -1)
    left, right = -1 if left is None else left, -1 if right is None else right
    q_len, k_len = q.shape[-2], k.shape[-2]
    reach_holds = q_len <= k_len and k_len > REACH_MIN_KEYS and not grad_taken(slopes)
    if not reach_holds:
        return _same_window(q.shape[-3], left, right)
    from .reach import head_reach

    windows = _same_window(q.shape[-3], left, right).clone()  # (H, 2)
    longest = kernel.longest_rows if kernel is not None else None
    for u, reach in enumerate(head_reach(q, k, slopes, scale, groups, longest)):
        if reach is None or reach >= k_len + q_len:  # no key that far
            continue
        heads = windows[u * groups:(u + 1) * groups]  # (groups, 2): the query heads of KV head u
        heads[heads < 0] = reach
        heads.clamp_(max=reach)
    return windows


def _unit_stride(x):
    """x as it is where its last dimension is contiguous (all the kernel needs), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


@functools.lru_cache(maxsize=64)
def _same_window(heads: int, left: int, right: int):
    """(H, 2): every head's (left, right), cached from call to call (the kernel only reads it)."""
    return torch.tensor([[left, right]] * heads, dtype=torch.int64)


# the reach skips the keys outside each head's window, but a block of 128 queries always spans 128 keys and
# twice the reach beside them (about 350 at the steepest usual slope, 1/2): up to 512 keys it would skip little
# and cost its pass over q and k
REACH_MIN_KEYS = 512


class FusedALiBi(torch.autograd.Function):
    """``apply(q, k, v, slopes, windows, scale, causal, kernel)``: q (B, H, i, d), k and v (B, H_kv, j, d) with a
    unit stride along d, slopes (H,), windows (H, 2). Returns (B, H, i, d); gradients for q, k, v and the slopes."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, windows, scale, causal, kernel):
        out, lse = kernel.forward(q, k, v, slopes.detach(), windows, scale, causal)
        ctx.save_for_backward(q, k, v, out, lse, slopes, windows)
        ctx.scale, ctx.causal, ctx.kernel = scale, causal, kernel
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse, slopes, windows = ctx.saved_tensors
        grad_out = _unit_stride(grad_out)
        slope_grads = ctx.needs_input_grad[3]
        dq, dk, dv, dslopes = ctx.kernel.backward(q, k, v, out, grad_out, lse, slopes.detach(), windows, ctx.scale,
                                                  ctx.causal, slope_grads)
        return dq, dk, dv, dslopes.to(slopes.dtype) if slope_grads else None, None, None, None, None
