"""Train short, test long: the paper's extrapolation experiment, small enough for a laptop CPU.

A byte-level causal language model is trained at context L on Python's own standard library
(source files every machine with Python has; nothing is downloaded), five times, identical but
for the position method: ALiBi, sinusoidal, learned absolute, rotary, and none (NoPE). Each is
then evaluated on the same held-out bytes cut into chunks of L, 2L, 4L, 8L and 16L: the
perplexity per byte. Learned absolute positions have no embedding past L; that is reported as
the error it is, as nanoGPT's assert does, not as a number.

    python -m alibi_ref extrapolate [--quick] [--device cuda] [--output DIR]
"""

from __future__ import annotations

import json
import math
import sysconfig
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import alibi_attention
from ..bias import alibi_bias
from ..slopes import get_slopes
from .figures import table  # noqa: F401  (the results' text table lives with their plots, free of torch)

METHODS = ("alibi", "sinusoidal", "rotary", "none", "learned")


@dataclass(frozen=True)
class Settings:
    context: int = 64  # L, the training length
    n_layer: int = 2
    d_model: int = 128
    n_head: int = 8
    slopes: tuple[float, ...] | None = None  # ALiBi's slope per head; None: the paper's, 1/2 .. 1/256 for 8 heads
    learn_slopes: bool = False  # ALiBi's slopes trained with the model, from ``slopes``
    batch: int = 32
    steps: int = 1100
    lr: float = 3e-3
    seed: int = 0
    eval_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    eval_chunks: int = 32  # held-out bytes = eval_chunks * max multiple * L
    device: str = "cpu"


DEFAULT = Settings()
QUICK = replace(DEFAULT, steps=200, eval_chunks=8)


# ----------------------------------------------------------------------------- data

def corpus(held_out_every: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) bytes of the standard library's top-level .py files; every 10th file is held out."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))
    if len(files) < 2 * held_out_every:
        raise RuntimeError(f"found only {len(files)} source files in {stdlib}: cannot build the corpus")
    parts: tuple[list[bytes], list[bytes]] = ([], [])
    for index, path in enumerate(files):
        parts[index % held_out_every == 0].append(path.read_bytes())
    train, held_out = (torch.frombuffer(bytearray(b"".join(p)), dtype=torch.uint8) for p in parts)
    return train.long(), held_out.long()


# ----------------------------------------------------------------------------- positions

def sinusoidal(T: int, d: int, device) -> torch.Tensor:
    """The original Transformer's position encoding, (T, d)."""
    position = torch.arange(T, device=device, dtype=torch.float32)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    pe = torch.zeros(T, d, device=device)
    pe[:, 0::2] = torch.sin(position * freq)
    pe[:, 1::2] = torch.cos(position * freq)
    return pe


def rotate(x: torch.Tensor) -> torch.Tensor:
    """RoPE (Su et al. 2021) on (B, H, T, hs): each pair of channels turned by position * frequency."""
    T, hs = x.shape[-2], x.shape[-1]
    freq = 10000.0 ** (-torch.arange(0, hs, 2, device=x.device, dtype=torch.float32) / hs)
    angle = torch.arange(T, device=x.device, dtype=torch.float32)[:, None] * freq  # (T, hs/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


# ----------------------------------------------------------------------------- the model

class Block(nn.Module):
    def __init__(self, s: Settings, method: str):
        super().__init__()
        self.method, self.n_head = method, s.n_head
        self.ln1, self.ln2 = nn.LayerNorm(s.d_model), nn.LayerNorm(s.d_model)
        self.qkv = nn.Linear(s.d_model, 3 * s.d_model)
        self.proj = nn.Linear(s.d_model, s.d_model)
        self.mlp = nn.Sequential(nn.Linear(s.d_model, 4 * s.d_model), nn.GELU(), nn.Linear(4 * s.d_model, s.d_model))
        slopes = torch.tensor(get_slopes(s.n_head) if s.slopes is None else s.slopes, dtype=torch.float32)
        if slopes.shape != (s.n_head,) or not (slopes > 0).all():
            raise ValueError(f"slopes: expected {s.n_head} positive numbers, one per head; got {s.slopes}")
        if s.learn_slopes:  # learned as logarithms: a slope stays positive, a penalty on distance, never a reward
            self.log_slopes = nn.Parameter(slopes.log())
        else:
            self.register_buffer("fixed_slopes", slopes, persistent=False)

    @property
    def slopes(self) -> torch.Tensor:
        """(nh,) ALiBi's slope for each head: fixed, or the learned ones."""
        return self.log_slopes.exp() if hasattr(self, "log_slopes") else self.fixed_slopes

    def heads(self, x):
        """q, k, v of ``x`` (B, T, C), each (B, nh, T, hs), rotated where the method is rotary."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)  # (B, nh, T, hs)
        if self.method == "rotary":
            q, k = rotate(q), rotate(k)
        return q, k, v

    def attention(self, x):
        q, k, v = self.heads(x)
        if self.method == "alibi":
            y = alibi_attention(q, k, v, self.slopes, causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(x.shape))  # (B, T, C)

    def attention_weights(self, x) -> torch.Tensor:
        """(B, nh, T, T): the weights this block's attention gives ``x`` (the block's input), built whole, for
        reading what each trained head looks at."""
        q, k, _ = self.heads(self.ln1(x))
        T = x.shape[1]
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
        if self.method == "alibi":
            scores = scores + alibi_bias(self.slopes, T, T, causal=True).to(scores.dtype)
        return scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf")
                                  ).softmax(dim=-1)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """A byte-level GPT whose only difference between runs is ``method``."""

    def __init__(self, s: Settings, method: str):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"unknown position method {method!r}; expected one of {', '.join(METHODS)}")
        self.method, self.context = method, s.context
        self.embed = nn.Embedding(256, s.d_model)
        self.position = nn.Embedding(s.context, s.d_model) if method == "learned" else None
        self.blocks = nn.ModuleList(Block(s, method) for _ in range(s.n_layer))
        self.ln_f = nn.LayerNorm(s.d_model)
        for module in self.modules():  # GPT-2's initialisation: small weights, so the first logits are small
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embedded(idx)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.embed.weight.T  # (B, T, 256), weights tied

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Each block's attention weights on ``idx``, (B, nh, T, T) per block: what the trained heads look at."""
        x, weights = self.embedded(idx), []
        for block in self.blocks:
            weights.append(block.attention_weights(x))
            x = block(x)
        return weights

    def embedded(self, idx: torch.Tensor) -> torch.Tensor:
        """The first block's input (B, T, C): tokens, and positions where the method adds them."""
        T = idx.shape[1]
        # token embeddings scaled by sqrt(d), as in the original Transformer and fairseq's LM (the paper's
        # code base): otherwise a sinusoidal encoding of size ~1 drowns the small initial embeddings
        x = self.embed(idx) * math.sqrt(self.embed.embedding_dim)  # (B, T, C)
        if self.method == "learned":
            if T > self.context:
                raise ValueError(f"learned absolute positions end at {self.context}: no embedding for position {T - 1}")
            x = x + self.position(torch.arange(T, device=idx.device))
        elif self.method == "sinusoidal":
            x = x + sinusoidal(T, x.shape[-1], idx.device)
        return x


# ----------------------------------------------------------------------------- train and evaluate

def train(model: TinyLM, data: torch.Tensor, s: Settings, on_step=None) -> list[float]:
    gen = torch.Generator().manual_seed(s.seed)
    # learned slopes without weight decay: decay would pull log m to 0, every slope towards 1, steeper
    slopes = [p for name, p in model.named_parameters() if name.endswith("log_slopes")]
    rest = [p for name, p in model.named_parameters() if not name.endswith("log_slopes")]
    groups = [{"params": rest}] + ([{"params": slopes, "weight_decay": 0.0}] if slopes else [])
    opt = torch.optim.AdamW(groups, lr=s.lr, weight_decay=0.01)
    warmup = max(1, s.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: min(1.0, (t + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(t, s.steps) / s.steps)))
    losses = []
    model.train()
    for _ in range(s.steps):
        start = torch.randint(0, len(data) - s.context - 1, (s.batch,), generator=gen)
        window = torch.stack([data[i:i + s.context + 1] for i in start.tolist()]).to(s.device)  # (B, L + 1)
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 256), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        losses.append(loss.item())
        if on_step:
            on_step(loss.item())
    return losses


@torch.no_grad()
def perplexity(model: TinyLM, tokens: torch.Tensor, length: int, device) -> float:
    """exp(mean negative log-likelihood) per byte over ``tokens`` cut into chunks of ``length``."""
    model.eval()
    chunks = tokens[: len(tokens) // (length + 1) * (length + 1)].view(-1, length + 1)
    total, count = 0.0, 0
    for batch in chunks.split(max(1, 4096 // length)):
        batch = batch.to(device)
        logits = model(batch[:, :-1])
        total += F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1), reduction="sum").item()
        count += batch[:, 1:].numel()
    return math.exp(total / count)


def run(s: Settings, methods=METHODS, output: Path | None = None, progress: bool = True) -> dict:
    """Train and evaluate every method; returns (and writes to ``output``) the results."""
    from tqdm import tqdm

    torch.manual_seed(s.seed)
    train_bytes, held_out = corpus()
    longest = max(s.eval_multiples) * s.context
    # the same held-out bytes for every length: a whole number of chunks at each of them
    held_out = held_out[: s.eval_chunks * (longest + 1)]
    results: dict = {"settings": asdict(s), "train_bytes": len(train_bytes), "held_out_bytes": len(held_out),
                     "perplexity": {}, "train_loss": {}, "seconds": {}}
    for method in methods:
        torch.manual_seed(s.seed)  # identical initial weights wherever the architectures agree
        model = TinyLM(s, method).to(s.device)
        started = time.perf_counter()
        with tqdm(total=s.steps, desc=f"{method:>10}", disable=None if progress else True, leave=False) as bar:
            losses = train(model, train_bytes, s, on_step=lambda loss, bar=bar: (bar.update(), bar.set_postfix(
                loss=f"{loss:.3f}", refresh=False)))
        row = {}
        for multiple in s.eval_multiples:
            length = multiple * s.context
            try:
                row[str(length)] = perplexity(model, held_out, length, s.device)
            except ValueError as err:
                row[str(length)] = f"error: {err}"
        results["perplexity"][method] = row
        results["train_loss"][method] = sum(losses[-50:]) / len(losses[-50:])
        results["seconds"][method] = round(time.perf_counter() - started, 1)
    if output is not None:
        write(results, Path(output))
    return results


def write(results: dict, output: Path) -> None:
    from matplotlib.figure import Figure

    from .figures import extrapolation_curves

    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    extrapolation_curves(results, fig.add_subplot())
    fig.savefig(output / "extrapolation.png", dpi=120)
