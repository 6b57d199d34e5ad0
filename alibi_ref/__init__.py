"""alibi_ref: the reference implementation of ALiBi (Press, Smith & Lewis, ICLR 2022).

Attention with Linear Biases drops position embeddings and adds a fixed penalty,
linear in distance, to every attention score:

    softmax(q_i . k_j / sqrt(d) - m_h * |i - j|)

Because softmax is invariant to adding a constant to a row, only the *differences*
between a row's biases matter: a key one step further away is worth exp(-m_h)
times less, whatever the absolute positions. That is why a model trained on short
sequences sees nothing new on long ones.

NumPy and PyTorch (any device) share one API; torch is imported only when used.
"""

from . import examples
from .attention import alibi_attention, multi_head_alibi, naive_attention
from .bias import alibi_bias, key_only_bias
from .cpu import flush_denormals
from .examples import cat_sat_on_mat
from .explain import explain
from .slopes import SCHEDULES, get_slopes

__all__ = [
    "SCHEDULES",
    "ALiBiMultiheadAttention",
    "alibi_attention",
    "alibi_bias",
    "cat_sat_on_mat",
    "examples",
    "explain",
    "flush_denormals",
    "get_slopes",
    "key_only_bias",
    "multi_head_alibi",
    "naive_attention",
]


def __getattr__(name):
    # the nn.Module needs torch at class definition: import it on first use only
    if name == "ALiBiMultiheadAttention":
        from .nn import ALiBiMultiheadAttention

        return ALiBiMultiheadAttention
    raise AttributeError(f"module 'alibi_ref' has no attribute {name!r}")
