"""The learned head's products and weight gradient in fixed pieces (``scorer``'s training loop): the
(2, L*d) x (L*d, S_i) product of Eq. (linear-head) per block of spans, computed by one-thread workers, and its
weight gradient with the bits autograd's backward would give (orientation probed once per process, terms
summed in autograd's order), so a fit's weights do not depend on the caller's thread count."""
from __future__ import annotations

import functools

import numpy as np

from .._core.threads import fixed_threads


def _flat_weights(W):
    """W (L, d, 2) as the (2, L*d) matrix of Eq. (linear-head): a 2 x 17k copy of the weights only."""
    return W.permute(2, 0, 1).reshape(2, W.shape[0] * W.shape[1])


def _block_product(Wt, x):
    """One block's (S_i, 2) outputs without the bias: the (2, L*d) x (L*d, S_i) product on a view."""
    return (Wt @ x.reshape(-1, Wt.shape[1]).T).T


def _products(Wt, blocks: list, pool):
    """Eq. (linear-head) without the bias: the (2, L*d) x (L*d, S_i) product of each block, computed by
    the pool's one-thread workers; (S, 2), the same bits as :func:`span_outputs` (which adds b)."""
    import torch
    outs = list(pool.map(lambda x: _block_product(Wt, x), blocks))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


# (spans, width) of the seeded blocks on which the two orientations of a block's weight gradient are
# compared once per process (the widths of 1, 2, 8 and 30 layers of 576 states)
GRAD_PROBE_SHAPES = ((1, 1152), (3, 1152), (16, 17280), (97, 1152), (480, 4608), (1031, 576))


def _grad_term(x, g, rows: bool):
    """One block's d loss / d Wt = g^T X for X (S_i, K) and g (S_i, 2): as the product's backward
    computes it, (X^T g)^T, or with ``rows`` as the (2, S_i) x (S_i, K) product g^T X (about twice as
    fast at one thread: measured 6 vs 13 ms on a 480 x 17,280 block)."""
    return g.t().mm(x) if rows else x.t().mm(g).t()


@functools.cache
def _rows_exact() -> bool:
    """Whether :func:`_grad_term` with ``rows`` gives the bits of autograd's orientation on this machine's
    kernels at one thread, tried once per process on seeded blocks of ``GRAD_PROBE_SHAPES``. The two
    agree with AVX-512 MKL kernels (all of 640 shapes tried, 1 to 5,000 spans, widths 576 to 17,856)
    and differ with AVX2 ones (632 of the 640), where autograd's orientation is kept."""
    import torch
    gen = torch.Generator().manual_seed(0)
    with fixed_threads():
        for n, k in GRAD_PROBE_SHAPES:
            x, g = torch.randn(n, k, generator=gen), torch.randn(n, 2, generator=gen)
            if not torch.equal(_grad_term(x, g, True), _grad_term(x, g, False)):
                return False
    return True


def _weight_grad(grad, blocks: list, pool):
    """d loss / d Wt = sum_i grad_i^T X_i for ``grad`` (S, 2) of :func:`_products`' output: each
    block's term with the bits of the product's backward, (X_i^T grad_i)^T (directly, or as the faster
    grad_i^T X_i where :func:`_rows_exact` found the two equal), in the pool; the terms added last
    block first, the order in which autograd's engine reaches them, so the sum has its bits too. The
    orientation matters: with AVX2 kernels (MKL) grad_i^T X_i rounds differently (measured under the
    AVX2 emulation; on AVX-512 both agree)."""
    K = blocks[0].shape[1] * blocks[0].shape[2]
    ends = np.cumsum([x.shape[0] for x in blocks])
    starts = ends - np.array([x.shape[0] for x in blocks])
    rows = _rows_exact()
    parts = list(pool.map(lambda i: _grad_term(blocks[i].reshape(-1, K),
                                               grad.narrow(0, int(starts[i]), int(ends[i] - starts[i])), rows),
                          range(len(blocks))))
    total = parts[-1]
    for part in parts[-2::-1]:
        total = total + part
    return total.contiguous()
