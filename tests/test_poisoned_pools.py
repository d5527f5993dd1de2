"""The test harness's poisoned memory pools (conftest.poisoned_cuda_pool and poisoned_output), which the GPU tests
use to show that a kernel wrote every output: a fresh allocation inside one holds the poison, a block that needs
more memory than the poisoned segments fails, an output that misses the poisoned block fails, and a pool counts as
in use exactly while a tensor from it is alive."""
import pytest
import torch

from conftest import (_pool_has_live_blocks, cuda_caching_allocator_on, poisoned_cuda_pool, poisoned_output,
                      requires_cuda)

pytestmark = [requires_cuda, pytest.mark.gpu,
              pytest.mark.skipif(not cuda_caching_allocator_on(), reason="the pools need the caching allocator")]


@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
def test_allocations_hold_the_poison(large):
    numel = (1 << 20) if large else 1000  # 4 MiB lands in the large segment, 4 kB in the small one
    with poisoned_cuda_pool(float("nan"), large=large):
        out = torch.empty(numel, device="cuda")
    assert out.isnan().all()


def test_allocations_hold_a_poison_of_another_dtype():
    with poisoned_cuda_pool(-7, dtype=torch.int32):
        ints = torch.empty(1000, dtype=torch.int32, device="cuda")
    assert (ints == -7).all()


def test_allocating_beyond_the_poisoned_segments_fails():
    with pytest.raises(AssertionError, match="allocated outside the poisoned segments"):
        with poisoned_cuda_pool(float("nan")):  # small segment only: 8 MB needs a segment of its own
            beyond = torch.empty(2 << 20, device="cuda")
    assert beyond.numel() == 2 << 20


def test_poisoned_output_lands_in_the_poison():
    shape = (3000, 1000)  # 12 MB: a segment of its own, beyond poisoned_cuda_pool's
    out = poisoned_output(lambda: torch.empty(shape, device="cuda"), shape)
    assert out.isnan().all()
    halves = poisoned_output(lambda: torch.empty(shape, dtype=torch.half, device="cuda"), shape, torch.half)
    assert halves.isnan().all()


def test_poisoned_output_that_misses_the_poison_fails():
    def allocates_scratch_first():
        scratch = torch.ones(3000, 1000, device="cuda")  # takes the poisoned block
        out = torch.empty(3000, 1000, device="cuda")
        del scratch
        return out

    with pytest.raises(AssertionError, match="did not land in the poisoned memory"):
        poisoned_output(allocates_scratch_first, (3000, 1000))
    with pytest.raises(AssertionError, match=r"\(\(3000, 1000\), \(1000, 3000\)\)"):  # right place, wrong shape
        poisoned_output(lambda: torch.empty(3000, 1000, device="cuda"), (1000, 3000))


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
