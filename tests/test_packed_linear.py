"""Linear layers with oneDNN-packed weights: the same products as nn.Linear, the packed copy
used from PACKED_FROM rows, hooks and tied weights kept, and the runner packing only where
the weights outgrow the cache (or as configured)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minedraft import bundled
from minedraft.config import RunnerConfig
from minedraft.model import packed_linear
from minedraft.model.packed_linear import PACKED_FROM, PackedLinear, pack_linears, packing_pays
from minedraft.model_runner import ForwardChunk, ModelRunner

pytestmark = pytest.mark.skipif(not packed_linear.packing_available(torch.device("cpu"), torch.float32),
                                reason="this torch build has no oneDNN")


@pytest.mark.parametrize("bias", [True, False])
def test_products_equal_nn_linear_and_the_packed_copy_serves_calls_of_four_rows_or_more(bias):
    torch.manual_seed(0)
    layer = nn.Linear(96, 160, bias=bias)
    inputs = {rows: torch.randn(rows, 96) for rows in range(1, 10)}
    inputs["3d"] = torch.randn(2, 3, 96)
    expected = {key: layer(x).detach() for key, x in inputs.items()}
    assert pack_linears(nn.Sequential(layer)) == 1 and isinstance(layer, PackedLinear)
    with torch.no_grad():
        for key, x in inputs.items():
            torch.testing.assert_close(layer(x), expected[key], rtol=1e-4, atol=1e-5)
        # Which copy a call reads: with the weight itself zeroed, only calls under PACKED_FROM rows change.
        layer.weight.zero_()
        for key, x in inputs.items():
            rows = x.numel() // 96
            if rows < PACKED_FROM:
                torch.testing.assert_close(layer(x), (layer.bias if bias else torch.zeros(160)).expand(rows, 160))
            else:
                torch.testing.assert_close(layer(x), expected[key], rtol=1e-4, atol=1e-5)


def test_packing_keeps_hooks_parameters_and_a_tied_head():
    embed = nn.Embedding(50, 32)
    head = nn.Linear(32, 50, bias=False)
    head.weight = embed.weight
    model = nn.ModuleDict({"embed": embed, "head": head})
    calls = []
    head.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    names = [name for name, _ in model.named_parameters()]
    pack_linears(model)
    assert [name for name, _ in model.named_parameters()] == names and head.weight is embed.weight
    head(torch.randn(5, 32))
    assert calls == [torch.Size([5, 50])]


def test_packing_pays_only_where_the_linear_weights_outgrow_the_cache(monkeypatch):
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256))     # 512 KiB of weights
    cpu = torch.device("cpu")
    monkeypatch.setattr(packed_linear, "last_level_cache_bytes", lambda: 1 << 20)
    assert not packing_pays(model, cpu, torch.float32)
    monkeypatch.setattr(packed_linear, "last_level_cache_bytes", lambda: 256 << 10)
    assert packing_pays(model, cpu, torch.float32)
    assert not packing_pays(model, cpu, torch.bfloat16)
    assert packed_linear.last_level_cache_bytes() > 0


def test_runner_logits_equal_packed_or_not_and_the_setting_is_checked():
    chunks = [[ForwardChunk("a", list(range(5, 40)), num_logits=3)], [ForwardChunk("a", [7, 8, 9, 10, 11], num_logits=5)],
              [ForwardChunk("a", [12], num_logits=1)]]
    logits = {}
    for setting in ("off", "on"):
        runner = ModelRunner(RunnerConfig(bundled.TARGET, packed_weights=setting, num_blocks=32))
        assert runner.packed == (setting == "on")
        assert isinstance(runner.model.layers[0].mlp.down_proj, PackedLinear) == (setting == "on")
        with torch.no_grad():
            logits[setting] = [runner.forward(chunk) for chunk in chunks]
    for off, on in zip(logits["off"], logits["on"]):
        torch.testing.assert_close(on, off, rtol=1e-4, atol=1e-4)
        assert torch.equal(on.argmax(-1), off.argmax(-1))
    with pytest.raises(ValueError, match="packed_weights"):
        RunnerConfig(bundled.TARGET, packed_weights="always")
    with pytest.raises(ValueError, match="packed_weights 'on'"):
        ModelRunner(RunnerConfig(bundled.TARGET, packed_weights="on", dtype="bfloat16", num_blocks=8))
