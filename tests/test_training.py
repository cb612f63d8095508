"""Paper section 5: batches, label smoothing, the schedule, token batching, accumulation, greedy
decoding."""

import pytest
import torch
import torch.nn.functional as F

from annotated import make_model
from annotated.batching import BOS, EOS, PAD, Batch
from annotated.decoding import greedy_decode
from annotated.loss import LabelSmoothing
from annotated.schedule import make_optimizer, rate
from annotated.training.tasks.copy import copy_batch
from annotated.training_step import train_step


def test_batch_shifts_and_masks():
    src = torch.tensor([[4, 5, EOS, PAD]])
    tgt = torch.tensor([[BOS, 7, 8, EOS, PAD]])
    b = Batch(src, tgt, PAD)
    assert b.tgt.tolist() == [[BOS, 7, 8, EOS]] and b.tgt_y.tolist() == [[7, 8, EOS, PAD]]
    assert b.src_mask.tolist() == [[[True, True, True, False]]]
    assert b.ntokens == 3
    expected = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    assert torch.equal(b.tgt_mask[0], expected)  # no padding in the decoder input here
    b2 = Batch(src, torch.tensor([[BOS, 7, EOS, PAD, PAD]]), PAD)
    assert not b2.tgt_mask[0, :, 3].any()  # the padded input position is hidden


def test_label_smoothing_distribution_matches_paper():
    V, eps = 7, 0.1
    crit = LabelSmoothing(V, padding_idx=0, smoothing=eps)
    target = torch.tensor([3, 0, 6])
    crit(torch.randn(3, V).log_softmax(-1), target)
    q = crit.true_dist
    assert q[0, 3] == pytest.approx(1 - eps) and q[0, 0] == 0
    others = [k for k in range(V) if k not in (0, 3)]
    torch.testing.assert_close(q[0, others], torch.full((V - 2,), eps / (V - 2)))
    torch.testing.assert_close(q[[0, 2]].sum(-1), torch.ones(2))
    assert (q[1] == 0).all()


def test_label_smoothing_loss_agrees_with_cross_entropy():
    """KL(q||p) = CE(q, p) - H(q); torch's cross_entropy with label_smoothing uses a different
    spread, so compare with an independent soft-target cross-entropy."""
    V, eps = 11, 0.1
    logits = torch.randn(20, V, dtype=torch.float64)
    target = torch.randint(0, V, (20,))
    target[::4] = 0
    crit = LabelSmoothing(V, 0, eps)
    loss = crit(logits.log_softmax(-1), target)
    q = crit.true_dist.double()
    ce = -(q * logits.log_softmax(-1)).sum()
    entropy = -(q[q > 0] * q[q > 0].log()).sum()
    torch.testing.assert_close(loss, ce - entropy)
    # with no smoothing it is exactly the cross-entropy over non-padding positions
    plain = LabelSmoothing(V, 0, 0.0)(logits.log_softmax(-1), target)
    torch.testing.assert_close(
        plain, F.cross_entropy(logits, target, ignore_index=0, reduction="sum")
    )


@pytest.mark.parametrize(
    "step,expected",
    [
        (1, 512**-0.5 * 4000**-1.5),
        (100, 512**-0.5 * 100 * 4000**-1.5),
        (4000, (512 * 4000) ** -0.5),
        (10000, 512**-0.5 * 10000**-0.5),
        (100000, 512**-0.5 * 100000**-0.5),
    ],
)
def test_rate_values(step, expected):
    assert rate(step, 512, 1.0, 4000) == pytest.approx(expected, rel=1e-12)


def test_rate_peak_and_factor():
    assert rate(4000, 512) == pytest.approx(6.9877e-4, abs=1e-8)
    assert rate(0, 512) == rate(1, 512)
    assert rate(3000, 1024, factor=2.0, warmup=8000) == pytest.approx(
        2 * rate(3000, 1024, warmup=8000)
    )
    assert max(rate(s, 512) for s in range(1, 20000)) == rate(4000, 512)


def test_scheduler_follows_rate_per_optimizer_step():
    model = torch.nn.Linear(2, 2)
    opt, sched = make_optimizer(model, d_model=512, warmup=4000)
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    for step in range(1, 6):
        assert opt.param_groups[0]["lr"] == pytest.approx(rate(step, 512))
        opt.step()
        sched.step()


def test_accumulation_equals_one_big_batch():
    torch.manual_seed(0)
    ref = make_model(10, 10, N=1, d_model=16, d_ff=32, h=2, dropout=0.0).double()
    batch = copy_batch(10, 12, generator=torch.Generator().manual_seed(1))
    src, tgt = batch.src, torch.cat([batch.tgt, batch.tgt_y[:, -1:]], dim=1)
    crit = LabelSmoothing(10, PAD, 0.1)
    finals = []
    for k in (1, 3):
        m = make_model(10, 10, N=1, d_model=16, d_ff=32, h=2, dropout=0.0).double()
        m.load_state_dict(ref.state_dict())
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        micro = [Batch(s, t, PAD) for s, t in zip(src.chunk(k), tgt.chunk(k))]
        train_step(m, micro, crit, opt)
        finals.append(torch.cat([p.flatten() for p in m.parameters()]))
    torch.testing.assert_close(finals[0], finals[1], rtol=1e-10, atol=1e-12)


def test_greedy_decode_shapes_and_end_symbol():
    torch.manual_seed(0)
    model = make_model(9, 9, N=1, d_model=16, d_ff=32, h=2, dropout=0.0).eval()
    src = torch.randint(3, 9, (3, 5))
    out = greedy_decode(model, src, (src != PAD)[:, None], max_len=7, start_symbol=BOS)
    assert out.shape == (3, 7) and (out[:, 0] == BOS).all()
    with torch.no_grad():  # the first generated token is the argmax of the first decoder step
        memory = model.encode(src, (src != PAD)[:, None])
        first = model.generator(
            model.decode(memory, (src != PAD)[:, None], out[:, :1], None)[:, -1]
        ).argmax(-1)
    assert torch.equal(out[:, 1], first)
    stopped = greedy_decode(model, src, (src != PAD)[:, None], 7, BOS, end_symbol=int(first[0]))
    row = stopped[0].tolist()
    assert row[1] == int(first[0]) and all(t == int(first[0]) for t in row[1:])


@pytest.mark.parametrize("sizes", [(13, 64, 4, 10), (11, 5, 1, 1), (20, 7, 0, 3)])
def test_copy_batch_rows_are_the_symbols_drawn_with_their_ends(sizes):
    """Each row, built at once for the batch, is what the task defines row by row: the source
    its n symbols, </s> and padding; the target <s>, the same symbols, </s> and padding, with n
    and the symbols the generator's first draws."""
    vocab, rows, low, high = sizes
    batch = copy_batch(vocab, rows, min_len=low, max_len=high,
                       generator=torch.Generator().manual_seed(3))  # fmt: skip
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(low, high + 1, (rows,), generator=g).tolist()
    symbols = torch.randint(3, vocab, (rows, high), generator=g).tolist()
    assert batch.src.shape == (rows, high + 1) and batch.tgt.size(1) == high + 1  # tgt: <s>...
    for i, n in enumerate(lengths):
        src = symbols[i][:n] + [EOS] + [PAD] * (high - n)
        tgt = [BOS] + symbols[i][:n] + [EOS] + [PAD] * (high - n)
        assert batch.src[i].tolist() == src
        assert batch.tgt[i].tolist() + batch.tgt_y[i, -1:].tolist() == tgt
