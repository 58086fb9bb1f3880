"""The moving average of the weights (``ema_decay``, ``train/ema.py``): its arithmetic, the swap in and out, its
state."""

from __future__ import annotations

import pytest
import torch

from distrinews.train.ema import WeightAverage


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 2))
    model[0].weight.requires_grad_(False)  # frozen: nothing to average
    return model


def test_the_average_follows_the_warmed_up_decay_step_by_step():
    model = _model()
    average = WeightAverage(model, decay=0.9)
    assert average.names == ["1.weight", "1.bias"]
    expected = model[1].weight.detach().clone()
    for step in range(100):
        with torch.no_grad():
            model[1].weight.add_(1.0)  # an optimizer step
        decay = min(0.9, (1 + step) / (10 + step))  # the warm-up: the first weights fade fast
        expected = decay * expected + (1 - decay) * model[1].weight.detach()
        average.update()
    assert average.updates == 100 and average.current_decay() == 0.9
    assert torch.allclose(average.average[0], expected, atol=1e-5)
    assert not torch.allclose(average.average[0], model[1].weight)  # behind the weights, which kept moving


def test_applied_swaps_the_average_in_and_the_weights_back_exactly():
    model = _model()
    average = WeightAverage(model, decay=0.5)
    with torch.no_grad():
        model[1].weight.mul_(3.0)
    average.update()
    raw = {k: v.clone() for k, v in model.state_dict().items()}
    with average.applied():
        assert torch.equal(model[1].weight, average.average[0])
        assert torch.equal(model[0].weight, raw["0.weight"])  # the frozen table is left alone
    assert all(torch.equal(v, raw[k]) for k, v in model.state_dict().items())
    with pytest.raises(RuntimeError, match="an evaluation that fails"), average.applied():
        raise RuntimeError("an evaluation that fails")  # passed on, not swallowed
    assert all(torch.equal(v, raw[k]) for k, v in model.state_dict().items()), "restored after an error too"


def test_the_state_round_trips_and_reset_starts_from_the_weights():
    model = _model()
    first = WeightAverage(model, decay=0.8)
    with torch.no_grad():
        model[1].bias.add_(2.0)
    first.update()
    first.update()
    second = WeightAverage(_model(), decay=0.8)
    second.load_state_dict(first.state_dict())
    assert second.updates == 2 and all(torch.equal(a, b) for a, b in zip(first.average, second.average))
    second.reset()
    assert second.updates == 0 and torch.equal(second.average[1], second.params[1].detach())
