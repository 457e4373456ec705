"""The training engine's loss: label-smoothed cross-entropy against the PyTorch definition."""
import pytest
import torch
import torch.nn.functional as F

from taskformer.core.engine import SmoothedCrossEntropy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps,skip", [(0.1, 0), (0.0, 0), (0.2, -100)])
def test_smoothed_cross_entropy_matches_pytorch(dtype, eps, skip):
    torch.manual_seed(0)
    rows, vocab = 300, 5000  # several chunks, the last one partial
    logits = (3 * torch.randn(rows, vocab)).to(dtype).requires_grad_()
    gold = torch.randint(0, vocab, (rows,))
    gold[::7] = 0  # padding rows when skip is 0, a real class otherwise
    scale = torch.tensor(0.37)

    ours = SmoothedCrossEntropy.apply(logits, gold, eps, skip)
    (ours * scale).backward()
    ours_grad, logits.grad = logits.grad, None
    ref = F.cross_entropy(logits.float(), gold, label_smoothing=eps, ignore_index=skip, reduction="sum")
    (ref * scale).backward()

    assert torch.allclose(ours, ref, rtol=1e-5)
    assert ours_grad.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert torch.allclose(ours_grad.float(), logits.grad.float(), atol=tol)
    if skip == 0:
        assert ours_grad[::7].abs().max() == 0  # ignored rows get no gradient
