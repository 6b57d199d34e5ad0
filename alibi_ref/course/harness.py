"""Kernel-side adapters: how a check calls answers that are not plain functions of arrays.

They run in the student's kernel, graded or not, so they live apart from ``exercises`` (which holds the
references): a graded kernel's view of the package holds this module and not that one. A case names
them (``Exercise.adapter``, ``Case.pick``) and the kernel looks them up here.
"""

from __future__ import annotations

import tracemalloc


def score_mod_outputs(answer, slopes, causal=False, score=None):
    """Kernel side: the student's score_mod called, as FlexAttention calls it, on every (h, i, j) of
    ``score`` (H, N, N), a zero score of 10 x 10 when none is given."""
    import torch

    if score is None:
        score = torch.zeros(len(slopes), 10, 10, dtype=slopes.dtype, device=slopes.device)
    h, i, j = torch.meshgrid(*(torch.arange(n, device=score.device) for n in score.shape), indexing="ij")
    return answer(slopes, causal=causal)(score, torch.tensor(0, device=score.device), h, i, j)


def peak_and_output(answer, q, k, v, slopes, causal=True, block=64):
    """Kernel side: the peak memory numpy allocated while ``answer`` ran (tracemalloc), and its output."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        out = answer(q, k, v, slopes, causal=causal, block=block)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return float(peak), out


def gradient_of_summed_output(answer, q, k, v, slopes, causal=False):
    """Kernel side: the gradient of the answer's summed output with respect to ``q``, by autograd. An answer
    computed outside torch (NumPy) or detached carries none, and is told so."""
    import torch

    q = q.detach().requires_grad_(True)
    out = answer(q, k, v, slopes, causal=causal)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        raise TypeError("the output carries no gradient back to q: is it computed outside torch (in NumPy), or "
                        "detached?")
    (grad,) = torch.autograd.grad(out.sum(), q)
    return grad


NO_SLOPES_BUFFER = "no buffer named slopes"  # what module_facts reports where the module keeps none


def module_facts(answer, q, k, v, causal=False, query=0):
    """Kernel side: the student's module class built for q's heads, moved to q's device as a model is, and
    called: its trainable parameters, its slopes buffer, its output, and (where q_len = k_len) what its
    ``explain`` says of one query."""
    module = answer(q.shape[1]).to(q.device)
    buffers = dict(module.named_buffers())
    facts = {"trainable parameters": float(sum(p.numel() for p in module.parameters() if p.requires_grad)),
             "the slopes buffer": buffers["slopes"] if "slopes" in buffers else NO_SLOPES_BUFFER,
             "output": module(q, k, v, causal=causal)}
    if q.shape[-2] == k.shape[-2]:
        facts["explain"] = module.explain(q, k, v, query, causal=causal)
    return facts


def jitted_with_static_length(answer, slopes, T):
    """Kernel side: the answer compiled with ``jax.jit``, the length static (it sets a shape), as a model uses it."""
    import jax

    return jax.jit(answer, static_argnums=1)(slopes, T)


def last_three_of_first_row(bias):
    """Kernel side: the first head's last three entries of the first query's row (of a tensor, or of a list of
    per-head tensors alike)."""
    return bias[0][0, -3:]
