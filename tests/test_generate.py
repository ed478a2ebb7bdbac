"""A real client: transformers' `generate` on a small Llama built from a config (random weights, nothing
downloaded), its linears quantized with quantcore, greedy eagerly and with a static cache and a
compiled forward (fullgraph: every quantized linear is its custom op): the same tokens. Runs where
transformers is installed (it is no test dependency: `pip install transformers`)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from quantcore.nn import QuantLinear, quantize_model  # noqa: E402


def test_greedy_tokens_of_a_compiled_static_cache_decode_equal_eager():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                      max_position_embeddings=64, initializer_range=0.2)
    model = quantize_model(transformers.LlamaForCausalLM(config).eval(), dtype=torch.float8_e4m3fn)
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 2 * 7  # q, k, v, o, gate, up, down
    prompt = torch.randint(0, config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    greedy = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        eager = model.generate(prompt, **greedy)
        model.forward = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
        compiled = model.generate(prompt, **greedy, cache_implementation="static")
    assert eager.shape == (2, 15) and len(set(eager[:, 7:].flatten().tolist())) > 2  # not one repeated token
    assert torch.equal(compiled, eager)
