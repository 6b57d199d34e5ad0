"""Is 9.4's bump in the loss by position the text or the position? The same model on chunks moved by a few bytes.

    .venv/bin/python benchmarks/results/2026-11-29-ablation/shift_control.py
"""

from dataclasses import replace

import torch
import torch.nn.functional as F

from alibi_ref.lab.extrapolation import QUICK, TinyLM, corpus, train

T, STRETCHES = 128, [(0, 16), (16, 32), (32, 64), (64, 96), (96, 128)]
torch.set_num_threads(1)
train_bytes, held_out = corpus()
settings = replace(QUICK, context=32, d_model=64, batch=16, steps=150)
torch.manual_seed(0)
model = TinyLM(settings, "alibi")
train(model, train_bytes, settings)
model.eval()


def loss_by_position(offset: int, n: int = 128) -> torch.Tensor:
    """(T,) the model's loss at each position, over n held-out chunks starting ``offset`` bytes in."""
    chunks = held_out[offset: offset + n * (T + 1)].view(n, T + 1)
    with torch.no_grad():
        return F.cross_entropy(model(chunks[:, :-1]).transpose(1, 2), chunks[:, 1:], reduction="none").mean(0)


print("held_out bytes", len(held_out))
for offset in (0, 16, 32, 64, 5000):
    loss = loss_by_position(offset)
    print(offset, " ".join(f"{loss[a:b].mean():.3f}" for a, b in STRETCHES))
