"""The training engine's loss: label-smoothed cross-entropy against the PyTorch definition."""
import math

import pytest
import torch
import torch.nn.functional as F

from taskformer.core.loss import SmoothedCrossEntropy


def gradient_tolerance(logits, grad, scale, eps):
    """How far two correct implementations of the gradient ``scale * (p - eps/V - (1-eps) onehot)`` may differ.

    Both compute ``p = exp(x - lse)`` in fp32 and round the result to the logits' dtype once. An error
    of a few fp32 roundings in the argument ``x - lse`` moves ``p`` relatively by that much times
    ``|x| + |lse|``; the reduction over the vocabulary inside ``lse`` adds about log2(V) roundings, and
    SIMD kernels (AVX2, AVX-512, AMX) order it differently, so we allow 4 log2(V) of them. The final
    rounding to bf16 may differ by one unit in the last place on each side.
    """
    x = logits.float()
    lse = torch.logsumexp(x, -1, keepdim=True)
    p = (x - lse).exp()
    fp32_unit = torch.finfo(torch.float32).eps / 2
    roundings = 4 * math.log2(x.size(-1))
    argument = roundings * fp32_unit * (x.abs() + lse.abs())
    return scale * (p + eps / x.size(-1)) * argument + torch.finfo(logits.dtype).eps * grad.float().abs()


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
    err = (ours_grad.float() - logits.grad.float()).abs()
    assert (err <= gradient_tolerance(logits.detach(), logits.grad, scale, eps)).all(), err.max()
    if skip == 0:
        assert ours_grad[::7].abs().max() == 0  # ignored rows get no gradient
