"""Checkpoints against careless and hostile input: config patterns whose matching time is bounded,
block sizes that must be ints."""

from __future__ import annotations

import time

import pytest

from quantcore import InvalidInputError
from quantcore.nn import scheme_from_config
from quantcore.nn.schemes import compressed_tensors_matches, transformers_skips

FP8_CONFIG = {"quant_method": "fp8", "weight_block_size": [128, 128]}


# Patterns from config.json


@pytest.mark.parametrize("config,pattern", [
    (FP8_CONFIG | {"modules_to_not_convert": ["lm_head", "(a+)+$"]}, r"'\(a\+\)\+\$' repeats a group"),
    (FP8_CONFIG | {"modules_to_not_convert": ["(a|aa)*b"]}, "repeats a group"),
    (FP8_CONFIG | {"ignored_layers": ["(a?){25}a{25}"]}, "repeats a group"),
    (FP8_CONFIG | {"modules_to_not_convert": [".*.*.*.*x"]}, r"in about 2\.8e\+08 ways"),
    (FP8_CONFIG | {"modules_to_not_convert": ["a?" * 24]}, "ways"),
    (FP8_CONFIG | {"modules_to_not_convert": ["x" * 1100]}, "has 1100 characters"),
    (FP8_CONFIG | {"modules_to_not_convert": ["a)|(.*"]}, "is not a regular expression"),
    (FP8_CONFIG | {"modules_to_not_convert": ["lm_head", 3]}, "must be a list of module names"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"]}}, "ignore": ["re:(a+)+$"]},
     r"ignore/targets pattern '\(a\+\)\+\$' repeats a group"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["re:(x|xy)+z"]}}}, "repeats a group"),
])
def test_patterns_that_could_match_for_ever_are_refused_when_read(config, pattern):
    start = time.perf_counter()
    with pytest.raises(InvalidInputError, match=f"quantization_config: .*{pattern}"):
        scheme_from_config(config)
    assert time.perf_counter() - start < 0.5


def test_the_evil_pattern_is_refused_at_match_time_too():
    """(a+)+$ against 25 characters took ~5 s in `re` (doubling per character): now a typed error at once."""
    start = time.perf_counter()
    with pytest.raises(InvalidInputError, match=r"'\(a\+\)\+\$' repeats a group"):
        transformers_skips("a" * 25 + "!", ("(a+)+$",))
    with pytest.raises(InvalidInputError, match="repeats a group"):
        compressed_tensors_matches("a" * 25 + "!", "re:(a+)+$")
    # A name past the 128 characters the config was checked for is checked again for its own length.
    assert not transformers_skips("a" * 600, ("lm_head", ".*x"))
    with pytest.raises(InvalidInputError, match="a name of 300 characters"):
        transformers_skips("a" * 300, (".*.*.*x",))
    assert time.perf_counter() - start < 0.5


def test_real_patterns_still_match():
    fp8 = scheme_from_config(FP8_CONFIG | {"modules_to_not_convert": ["lm_head", r"model\.layers\.\d+\.mlp\.gate$"]})
    assert fp8.layer("model.layers.3.mlp.gate") is None and fp8.layer("lm_head") is None
    assert fp8.layer("model.layers.3.mlp.gate_proj") is not None
    ct = scheme_from_config({"quant_method": "compressed-tensors", "ignore": "re:.*lm_head",
                             "config_groups": {"FP8_BLOCK": ["re:.*layers\\.\\d+\\.(mlp|self_attn)\\..*"]}})
    assert ct.layer("model.lm_head") is None and ct.layer("model.layers.1.mlp.up") is not None
    assert ct.layer("model.embed") is None
    start = time.perf_counter()
    assert not transformers_skips("a" * 128, (".*.*.*x",))
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("block", [[128.5, 128], [True, 128], [128, 0], [128], "128x", ["128", 128.0]])
def test_weight_block_size_must_be_two_ints(block):
    with pytest.raises(InvalidInputError, match=r"weight_block_size must be two positive ints \[Bn, Bk\], got "):
        scheme_from_config(FP8_CONFIG | {"weight_block_size": block})


def test_weight_block_size_as_written_in_the_field():
    for block in ([128, 64], ["128", "64"], "128x64"):
        assert scheme_from_config(FP8_CONFIG | {"weight_block_size": block}).block_size == (128, 64)
