"""Train a small MLP on scikit-learn's digits (shipped with the package: no download) three ways that differ
only in the matrix products of the linear layers:

- "fp32":      torch.matmul in float32 (TF32 off)
- "corrected": torch_wmmae.corrected_matmul (autograd, under torch.compile(fullgraph=True))
- "tf32":      torch.matmul with TF32 (GPU only: the CPU has no TF32)

Same initial weights, same batch order. Prints the loss curves and test accuracies, writes a JSON file and a
PNG plot, and exits non-zero unless the corrected run's final training loss is within 1% of float32's.

    python examples/train_mlp.py [--device cuda|cpu] [--epochs 30] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os

import torch
from torch import nn

import torch_wmmae


class Linear(nn.Module):
    """nn.Linear with a pluggable matrix product (y = x W^T + b)."""

    def __init__(self, fan_in: int, fan_out: int, matmul):
        super().__init__()
        bound = fan_in**-0.5
        self.weight = nn.Parameter(torch.empty(fan_out, fan_in).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(fan_out).uniform_(-bound, bound))
        self.matmul = matmul

    def forward(self, x):
        return self.matmul(x, self.weight.t()) + self.bias


def make_model(matmul, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(Linear(64, 256, matmul), nn.ReLU(), Linear(256, 256, matmul), nn.ReLU(), Linear(256, 10, matmul))


def load_digits(device):
    from sklearn.datasets import load_digits as sk_load_digits

    data = sk_load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[perm].to(device), y[perm].to(device)
    split = int(0.8 * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])


def train(variant: str, device, epochs: int, train_set, test_set, seed: int = 0):
    if variant == "corrected":
        matmul = torch_wmmae.corrected_matmul
    else:
        matmul = torch.matmul
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = variant == "tf32"
    model = make_model(matmul, seed).to(device)
    forward = torch.compile(model, fullgraph=True) if variant == "corrected" else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    (x, y), (xt, yt) = train_set, test_set
    order = torch.Generator().manual_seed(seed + 1)
    losses = []
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=order).to(device)
        total, count = 0.0, 0
        for i in range(0, len(x), 128):
            idx = perm[i : i + 128]
            loss = loss_fn(forward(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            count += len(idx)
        losses.append(total / count)
    with torch.no_grad():
        accuracy = (forward(xt).argmax(1) == yt).float().mean().item()
    torch.backends.cuda.matmul.allow_tf32 = False
    return losses, accuracy


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "results"))
    args = p.parse_args()
    device = torch.device(args.device)
    train_set, test_set = load_digits(device)
    variants = ["fp32", "corrected"] + (["tf32"] if device.type == "cuda" else [])
    results = {v: train(v, device, args.epochs, train_set, test_set) for v in variants}

    print(f"{'epoch':>5} " + " ".join(f"{v:>12}" for v in variants))
    for e in range(args.epochs):
        print(f"{e + 1:5d} " + " ".join(f"{results[v][0][e]:12.6f}" for v in variants))
    fp32_final = results["fp32"][0][-1]
    for v in variants:
        final = results[v][0][-1]
        print(f"{v:>9}: final loss {final:.6f} ({(final - fp32_final) / fp32_final:+.2%} vs fp32), "
              f"test accuracy {results[v][1]:.4f}")
    gap = abs(results["corrected"][0][-1] - fp32_final) / fp32_final
    ok = gap <= 0.01

    os.makedirs(args.out, exist_ok=True)
    name = f"train_mlp_{device.type}"
    payload = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "epochs": args.epochs,
        "runs": {v: {"losses": results[v][0], "test_accuracy": results[v][1]} for v in variants},
        "corrected_vs_fp32_final_loss_gap": gap,
    }
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(payload, f, indent=1)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for v in variants:
        ax.plot(range(1, args.epochs + 1), results[v][0], label=f"{v} (test acc {results[v][1]:.3f})")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss")
    ax.set_title(f"MLP on digits, {payload['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, f"{name}.png"), dpi=120)
    print(f"corrected vs fp32 final loss: {gap:.3%} ({'PASS' if ok else 'FAIL'}: limit 1%)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
