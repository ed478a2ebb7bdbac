"""`quantcore.warmup`: the kernels and plans of a model's first forwards, made ahead."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import quantcore
from helpers import randn
from quantcore import InvalidInputError
from quantcore.nn import QuantExperts, quantize_model
from quantcore.runtime import plans


def model(gen):
    layers = nn.Sequential(nn.Linear(160, 96), nn.ReLU(), nn.Linear(96, 160), nn.ReLU(), nn.Linear(160, 96))
    for p in layers.parameters():
        p.data = randn(p.shape, gen=gen)
    return quantize_model(layers, dtype=torch.int8, skip=()).to(torch.bfloat16)


def test_warmup_plans_each_distinct_layer_for_each_batch_size(gen):
    net = model(gen)
    seconds = quantcore.warmup(net, (1, 3))
    assert list(seconds) == [1, 3] and all(s >= 0 for s in seconds.values())
    kept = dict(plans.plans)
    with torch.no_grad():
        for m in (1, 3):
            net(randn((m, 160), gen=gen, dtype=torch.bfloat16))
    assert plans.plans == kept  # the first layer and the last are one kind: two plans a batch size, all made


def test_warmup_plans_the_experts_layers_at_each_batch_size(gen):
    """A QuantExperts is run at each batch size with top_k experts a token: a forward of the model's own
    routing (int64 ids from topk, weights in the activations' dtype) then makes no new plan."""
    layer = QuantExperts.from_stacked(randn((4, 64, 128), gen=gen), randn((4, 128, 32), gen=gen), dtype=torch.int8)
    net = nn.Sequential(layer)
    seconds = quantcore.warmup(net, (1, 40), top_k=2)  # 2 routed rows: masked; 80: contiguous
    assert list(seconds) == [1, 40]
    kept = dict(plans.plans)
    with torch.no_grad():
        for m in (1, 40):
            weights, ids = torch.rand(m, 4, generator=gen).softmax(-1).topk(2)
            layer(randn((m, 128), gen=gen, dtype=torch.bfloat16), ids, weights.bfloat16())
    assert plans.plans == kept
    with pytest.raises(InvalidInputError, match="top_k must be an int from 1"):
        quantcore.warmup(net, (1,), top_k=0)


def test_warmup_runs_the_model_on_given_inputs(gen):
    net = model(gen)
    shapes = []
    seconds = quantcore.warmup(net, (2,), inputs=lambda m: (shapes.append(m) or randn((m, 1, 160), gen=gen,
                                                                                       dtype=torch.bfloat16),))
    assert shapes == [2] and list(seconds) == [2]


def test_warmup_refuses_what_is_no_model_or_batch_size(gen):
    with pytest.raises(InvalidInputError, match="expected an nn.Module"):
        quantcore.warmup("model")
    with pytest.raises(InvalidInputError, match=r"batch_sizes\[i\] must be an int from 1"):
        quantcore.warmup(model(gen), (0,))
