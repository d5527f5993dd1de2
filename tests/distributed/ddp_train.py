"""DDP training with corrected_matmul (issue #6), launched by tests/test_multi_gpu.py:

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/distributed/ddp_train.py --out result.json

A small MLP whose linear layers compute x W^T with torch_wmmae.corrected_matmul (autograd through the op's
backward) is trained with DistributedDataParallel for a few SGD steps on fixed-seed synthetic data, each rank
on its own half of every batch. Rank 0 writes a JSON report and every rank exits non-zero if a check fails:

(a) the loss (averaged over ranks) decreases;
(b) after training the parameters are bitwise identical on every rank (all_gather);
(c) they match a single-process float32 run (torch.matmul, TF32 off) on the full batches, which follows the
    same trajectory because DDP averages the gradients of equal-sized shards: the mean of the shard means.

--backend nccl with --device cuda (one GPU per rank, the default), or gloo with cpu (the CPU implementation).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import torch_wmmae

IN, HIDDEN, OUT = 32, 64, 4
BATCH = 256  # per step, split evenly over the ranks


class Linear(nn.Module):
    """nn.Linear with its product x W^T computed by `matmul` (corrected_matmul, or torch.matmul)."""

    def __init__(self, fan_in, fan_out, matmul):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(fan_out, fan_in))
        self.bias = nn.Parameter(torch.empty(fan_out))
        self.matmul = matmul
        bound = fan_in**-0.5
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return self.matmul(x, self.weight.t()) + self.bias


def make_model(matmul, device):
    torch.manual_seed(1234)  # the same initial parameters on every rank and in the reference run
    return nn.Sequential(Linear(IN, HIDDEN, matmul), nn.Tanh(), Linear(HIDDEN, HIDDEN, matmul), nn.Tanh(),
                         Linear(HIDDEN, OUT, matmul)).to(device)


def make_data(steps, device):
    """Fixed-seed batches of a smooth teacher function with a little noise: (steps, BATCH, IN), (steps, BATCH, OUT)."""
    g = torch.Generator().manual_seed(99)
    x = torch.randn(steps, BATCH, IN, generator=g)
    w1, w2 = torch.randn(IN, 16, generator=g) / IN**0.5, torch.randn(16, OUT, generator=g)
    y = torch.sin(x @ w1) @ w2 + 0.01 * torch.randn(steps, BATCH, OUT, generator=g)
    return x.to(device), y.to(device)


def corrected(x, w):
    return torch_wmmae.corrected_matmul(x, w)


def train(model, x, y, lr, shard=None):
    """SGD with momentum on every batch; `shard` = (rank, world): this rank's contiguous part of each batch.
    Returns the per-step losses (of the full batch: averaged over ranks when sharded)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(x.shape[0]):
        xb, yb = x[step], y[step]
        if shard is not None:
            rank, world = shard
            per = BATCH // world
            xb, yb = xb[rank * per : (rank + 1) * per], yb[rank * per : (rank + 1) * per]
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.detach().clone()
        if shard is not None:
            dist.all_reduce(value)
            value /= shard[1]
        losses.append(value.item())
    return losses


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.03)
    parser.add_argument("--out", default=None, help="JSON report written by rank 0")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend, device_id=device if args.device == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert BATCH % world == 0

    x, y = make_data(args.steps, device)
    model = make_model(corrected, device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if args.device == "cuda" else None)
    losses = train(ddp, x, y, args.lr, shard=(rank, world))

    # (b) identical parameters on every rank
    mine = flat_params(model)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    identical = all(torch.equal(gathered[0], g) for g in gathered[1:])

    report = {"rank": rank, "world": world, "device": str(device), "losses": losses, "identical_on_ranks": identical}
    ok = identical and losses[-1] < 0.5 * losses[0]
    if rank == 0:
        # (c) a single-process float32 reference on the full batches
        ref_model = make_model(torch.matmul, device)
        ref_losses = train(ref_model, x, y, args.lr)
        ref = flat_params(ref_model)
        param_rel_diff = (torch.linalg.vector_norm(mine.double() - ref.double()) / torch.linalg.vector_norm(ref.double())).item()
        loss_rel_diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        report.update(reference_losses=ref_losses, param_rel_diff=param_rel_diff, loss_rel_diff=loss_rel_diff,
                      max_abs_param_diff=(mine - ref).abs().max().item())
        ok = ok and param_rel_diff < 1e-4 and loss_rel_diff < 1e-4
        report["ok"] = ok
        print(json.dumps(report), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f)
    verdict = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
    code = 0 if verdict.item() == 1 else 1
    del ddp
    dist.barrier()
    dist.destroy_process_group()
    # os._exit: no interpreter finalization, during which Gloo's worker threads can still release work
    # objects holding Python references and abort the process ("terminate called without an active
    # exception", SIGABRT; seen on 3 of 12 CPU runs here, after every check had passed).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
