"""Two processes (torch.distributed, gloo on CPU): 'global' statistics give identical eps on both ranks,
equal to one process on the concatenated batch."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from acpo_trl.losses import acpo_clip_range


def shards():
    g = torch.Generator().manual_seed(0)
    logps = (torch.rand(8, 13, generator=g) ** 2).clamp(min=1e-6).log()
    old_logps = logps + 0.4 * torch.randn(8, 13, generator=g)
    mask = (torch.rand(8, 13, generator=g) > 0.25).float()
    return logps, old_logps, mask


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    logps, old_logps, mask = (t[rank * 4 : (rank + 1) * 4] for t in shards())

    def all_reduce(t):
        t = t.clone()
        dist.all_reduce(t)
        return t

    _, global_stats = acpo_clip_range(logps, old_logps, mask, all_reduce=all_reduce)
    _, local_stats = acpo_clip_range(logps, old_logps, mask)
    torch.save({"global": global_stats.eps, "local": local_stats.eps}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_global_scope_agrees_across_ranks_and_with_one_process(tmp_path):
    mp.start_processes(_worker, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    torch.testing.assert_close(r0["global"], r1["global"], rtol=0, atol=0)
    _, whole = acpo_clip_range(*shards())
    torch.testing.assert_close(r0["global"], whole.eps)
    # The per-micro-batch ("local") statistic is what differs between ranks.
    assert not torch.allclose(r0["local"], r1["local"])
