import torch
from dataclasses import replace
import torch.nn.functional as F
from alibi_ref.lab.extrapolation import QUICK, TinyLM, corpus, train
torch.set_num_threads(1)
train_bytes, held_out = corpus()
s = replace(QUICK, context=32, d_model=64, batch=16, steps=150)
torch.manual_seed(0); m = TinyLM(s, "alibi"); train(m, train_bytes, s); m.eval()
T=128
def lbp(offset, n=128):
    b = held_out[offset: offset + n*(T+1)].view(n, T+1)
    with torch.no_grad():
        return F.cross_entropy(m(b[:, :-1]).transpose(1, 2), b[:, 1:], reduction="none").mean(0)
print("held_out bytes", len(held_out))
for off in (0, 16, 32, 64, 5000):
    l = lbp(off)
    print(off, " ".join(f"{l[a:b].mean():.3f}" for a,b in [(0,16),(16,32),(32,64),(64,96),(96,128)]))
