"""The test harness's poisoned memory pools (conftest.poisoned_cuda_pool), which the GPU tests use to show that a
kernel wrote every output: a fresh allocation inside one holds the poison, a block that needs more memory than the
poisoned segments fails, and a pool counts as in use exactly while a tensor from it is alive."""
import pytest
import torch

from conftest import _pool_has_live_blocks, cuda_caching_allocator_on, poisoned_cuda_pool, requires_cuda

pytestmark = [requires_cuda, pytest.mark.gpu,
              pytest.mark.skipif(not cuda_caching_allocator_on(), reason="the pools need the caching allocator")]


@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
def test_allocations_hold_the_poison(large):
    numel = (1 << 20) if large else 1000  # 4 MiB lands in the large segment, 4 kB in the small one
    with poisoned_cuda_pool(float("nan"), large=large):
        out = torch.empty(numel, device="cuda")
    assert out.isnan().all()
    with poisoned_cuda_pool(-7, dtype=torch.int32):
        ints = torch.empty(1000, dtype=torch.int32, device="cuda")
    assert (ints == -7).all()


def test_allocating_beyond_the_poisoned_segments_fails():
    with pytest.raises(AssertionError, match="allocated outside the poisoned segments"):
        with poisoned_cuda_pool(float("nan")):  # small segment only: 8 MB needs a segment of its own
            beyond = torch.empty(2 << 20, device="cuda")
    assert beyond.numel() == 2 << 20


def test_pool_in_use_while_its_tensor_lives():
    with poisoned_cuda_pool(float("nan")) as pool:
        out = torch.ones(1000, device="cuda")
        scratch = torch.ones(1000, device="cuda")
        del scratch
    device = torch.cuda.current_device()
    assert _pool_has_live_blocks(pool, device)
    view = out[10:20]
    del out
    assert _pool_has_live_blocks(pool, device), "a view keeps its storage in use"
    del view
    assert not _pool_has_live_blocks(pool, device)
