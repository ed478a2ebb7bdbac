"""How a Hugging Face checkpoint says its linears are block-quantized: `config.json`'s
`quantization_config`, read and written in the two flavours block FP8 comes in.

- `Fp8Scheme`: `quant_method: "fp8"` (DeepSeek-V3, transformers' `FineGrainedFP8Config`, vLLM's
  `Fp8Config`): one `weight_block_size` for every quantized linear, scales named `weight_scale_inv`,
  `modules_to_not_convert` (alias `ignored_layers`) matched with transformers' rules, and `scale_fmt`.
- `CompressedTensorsScheme`: `quant_method: "compressed-tensors"` (llm-compressor, vLLM) whose
  `config_groups` quantize weights FP8_BLOCK-style (float, 8 bits, `strategy: "block"`,
  `block_structure`) with dynamic 1×Bk activation groups, scales named `weight_scale`, `ignore` and
  `targets` matched with compressed-tensors' rules (exact name, `re:` regex, or the class "Linear").

Both answer `layer(name)`: the `LayerFormat` a linear of that dotted name is stored in, or None when
the config keeps it in floating point. `to_config()` writes the dict back; `scheme_from_config` and
`read_scheme` read one.

Plain dataclasses rather than pydantic models: the dicts are other libraries' formats (aliases such as
`ignored_layers`, fields that differ between their versions, unknown fields to ignore), and what a
reader must say is why quantcore computes a layer differently, which validators would restate line by
line.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping

try:  # the parser behind re.compile, to look at a pattern before running it
    from re import _parser as _sre  # Python >= 3.11
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre

from ..errors import InvalidInputError
from ..formats import SCALE_FORMATS
from .files import read_json

CONFIG_FILE = "config.json"
# transformers' default when modules_to_not_convert is absent: the output embedding stays in float.
DEFAULT_NOT_CONVERTED = ("lm_head",)
_OP = "quantization_config"


@dataclass(frozen=True)
class LayerFormat:
    """How one quantized linear is stored: its (Bn, Bk) weight block and its activations' scale format."""

    block_size: tuple[int, int]
    scale_fmt: str = "fp32"


def _fail(message: str) -> InvalidInputError:
    return InvalidInputError(f"{_OP}: {message}")


def _whole(v: Any) -> int | None:
    """A JSON int or a string of decimal digits as an int; None for anything else (int() would read
    128.5 as 128 and true as 1)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().isascii() and v.strip().isdigit():
        return int(v)
    return None


def _block(value: Any, key: str) -> tuple[int, int]:
    parts = value.split("x") if isinstance(value, str) else value  # compressed-tensors also accepts "128x128"
    block = tuple(_whole(v) for v in parts) if isinstance(parts, (list, tuple)) else ()
    if len(block) != 2 or None in block or min(block) < 1:
        raise _fail(f"{key} must be two positive ints [Bn, Bk], got {value!r}")
    return block


# Python's `re` backtracks and has no timeout, and these patterns come from a downloaded config.json, so a
# pattern is run only when its worst case is bounded. The work is at most about the number of ways the
# pattern can split a name among its repeats and alternatives: the product of each repeat's range and
# each alternation's branches, which grows as a power of the name's length (".*.*.*x": 129^3 ways for
# 128 characters) but is exponential when a repeat holds another repeat or an alternation ("(a+)+$",
# "(a|aa)*"), so those are refused outright. Within 2^23 ways the slowest patterns we tried took ~0.25 s
# per 128-character name in CPython 3.11 (23 "(?:a|a)" in a row; ".*.*.*x" takes 0.6 ms). Names up to
# _NAME_BOUND characters are covered by the check when the config is read; a longer name is checked again.
_MAX_PATTERN, _NAME_BOUND, _MAX_WAYS = 1024, 128, 2**23
_REPEATS = tuple(getattr(_sre, op) for op in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(_sre, op))


def _ways(items: Any, n: int, pattern: str, key: str) -> int:
    """How many ways a parsed (sub)pattern can split a name of `n` characters; raises for a repeat of
    something that can itself match in several ways."""
    ways = 1
    for op, av in items:
        if op in _REPEATS:
            lo, hi, body = av
            inner = _ways(body, n, pattern, key)
            if inner > 1 and hi > 1:
                raise _fail(f"{key} pattern {pattern!r} repeats a group that holds a repeat or an alternation (like "
                            "'(a+)+' or '(ab|a)*'), on which Python's re can take exponential time, so quantcore "
                            "refuses it: write the repeated part without an inner quantifier or '|'")
            ways *= inner * (min(hi, n) - min(lo, n) + 1)
        elif op == _sre.BRANCH:
            ways *= sum(_ways(branch, n, pattern, key) for branch in av[1])
        elif op == _sre.GROUPREF_EXISTS:  # (?(1)yes|no)
            ways *= _ways(av[1], n, pattern, key) + (_ways(av[2], n, pattern, key) if av[2] is not None else 1)
        elif op == _sre.SUBPATTERN:
            ways *= _ways(av[-1], n, pattern, key)
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
            ways *= _ways(av[1], n, pattern, key)
        elif op == getattr(_sre, "ATOMIC_GROUP", None):
            ways *= _ways(av, n, pattern, key)
    return ways


@functools.lru_cache(maxsize=4096)
def _regex(pattern: str, key: str, suffix: str = "", n: int = _NAME_BOUND) -> re.Pattern:
    """`pattern` (a config's `key` entry) compiled, followed by `suffix`, once its matching time on names
    of up to `n` characters is known to be bounded; `InvalidInputError` naming the pattern otherwise."""
    if len(pattern) > _MAX_PATTERN:
        raise _fail(f"{key} pattern {pattern[:40]!r}... has {len(pattern)} characters; quantcore matches patterns "
                    f"of at most {_MAX_PATTERN} (module names and short regular expressions)")
    try:
        ways = _ways(_sre.parse(pattern), n, pattern, key)
        compiled = re.compile(f"(?:{pattern}){suffix}")
    except (re.error, OverflowError, RecursionError) as e:
        raise _fail(f"{key} pattern {pattern!r} is not a regular expression ({e})") from None
    if ways > _MAX_WAYS:
        raise _fail(f"{key} pattern {pattern!r} can split a name of {n} characters among its repeats and "
                    f"alternatives in about {ways:.1e} ways, which Python's re may all try; quantcore allows "
                    f"{_MAX_WAYS:.1e}: use fewer '*', '+', '?' and '|' (a pattern matches from the start of the "
                    "name, so a trailing '.*' is not needed), or list the modules by name")
    return compiled


def _matcher(pattern: str, key: str, name: str, suffix: str = "") -> re.Pattern:
    """`_regex` checked for names as long as `name`."""
    return _regex(pattern, key, suffix, max(len(name), _NAME_BOUND))


def _patterns(value: Any, key: str) -> tuple[str, ...]:
    """A config's list of module patterns (a lone string is one pattern) as a tuple of strings."""
    patterns = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, (list, tuple)) else None
    if patterns is None or not all(isinstance(p, str) for p in patterns):
        raise _fail(f"{key} must be a list of module names or regular expressions (strings), got {value!r}")
    return patterns


_CT_KEY = "ignore/targets"
# transformers' module boundary after a pattern: a dot, the end, or a pattern that itself ended in one.
_BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"


def transformers_skips(name: str, patterns: tuple[str, ...]) -> bool:
    """transformers' `should_convert_module`, negated: a pattern skips `name` when, as a regex, it matches
    from the start up to a module boundary ("layers.1" skips "layers.1.mlp", not "layers.11.mlp"), or
    when `name` ends with it ("fc1" skips "model.layers.3.fc1"). Raises `InvalidInputError` for a
    pattern whose matching time is not bounded (see `_regex`)."""
    return any(_matcher(p, "modules_to_not_convert", name, _BOUNDARY).match(name) or name.endswith(p)
               for p in patterns)


def compressed_tensors_matches(name: str, target: str) -> bool:
    """compressed-tensors' target rule for a linear named `name`: "re:<regex>" matches from the start,
    "Linear" is the class every linear is, anything else is an exact module name. Raises
    `InvalidInputError` for a regex whose matching time is not bounded (see `_regex`)."""
    if target.startswith("re:"):
        return _matcher(target[3:], _CT_KEY, name).match(name) is not None
    return target == "Linear" or target == name


def _scale_fmt(value: Any) -> str:
    # transformers calls the fp32 format "float"; DeepSeek writes "ue8m0" or leaves the key out.
    fmt = {None: "fp32", "float": "fp32"}.get(value, value)
    if fmt not in SCALE_FORMATS:
        raise _fail(f"scale_fmt must be 'ue8m0', 'float' or 'fp32', got {value!r}")
    return fmt


@dataclass(frozen=True)
class Fp8Scheme:
    """`quant_method: "fp8"` with `weight_block_size`: every linear not matched by `not_converted`
    (transformers' rules; None: its default, ("lm_head",)) is stored in e4m3 with fp32 (or ue8m0)
    block scales named `weight_scale_inv`. scale_fmt "ue8m0": the scales are powers of two, and the
    activations' scales are rounded up to powers of two as DeepSeek-V3.1's inference does."""

    block_size: tuple[int, int]
    scale_fmt: str = "fp32"
    not_converted: tuple[str, ...] | None = None
    method: ClassVar[str] = "fp8"
    scale_name: ClassVar[str] = "weight_scale_inv"

    def layer(self, name: str) -> LayerFormat | None:
        """The format of linear `name`, or None when the config keeps it in floating point."""
        patterns = DEFAULT_NOT_CONVERTED if self.not_converted is None else self.not_converted
        return None if transformers_skips(name, patterns) else LayerFormat(self.block_size, self.scale_fmt)

    def to_config(self) -> dict[str, Any]:
        """The `quantization_config` dict transformers and vLLM read (vLLM's skip list is `ignored_layers`)."""
        config: dict[str, Any] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                  "weight_block_size": list(self.block_size)}
        if self.not_converted is not None:
            config["modules_to_not_convert"] = list(self.not_converted)
            config["ignored_layers"] = list(self.not_converted)
        if self.scale_fmt == "ue8m0":
            config["scale_fmt"] = "ue8m0"
        return config

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Fp8Scheme:
        """Read a `quant_method: "fp8"` dict; raise for what quantcore's layers would compute differently."""
        if config.get("weight_block_size") is None:
            raise _fail("quant_method 'fp8' without weight_block_size is per-tensor FP8, not block-wise; "
                        "quantcore loads block-scaled checkpoints (weight_block_size: [128, 128] and the like)")
        if str(config.get("activation_scheme", "dynamic")).lower() != "dynamic":
            raise _fail(f"activation_scheme {config['activation_scheme']!r}: QuantLinear quantizes activations "
                        "dynamically (per 1xBk group); static activation scales are not supported")
        if config.get("fmt", "e4m3") != "e4m3":
            raise _fail(f"fmt {config['fmt']!r}: quantcore stores FP8 weights as e4m3")
        if config.get("modules_to_convert") or config.get("expert_dtype", "fp8") != "fp8":
            raise _fail("modules_to_convert and expert_dtype other than 'fp8' (quantized embeddings, FP4 experts) "
                        "are not supported; quantcore loads block-FP8 linear layers")
        skip = config.get("modules_to_not_convert")
        if skip is None:
            skip = config.get("ignored_layers")
        if skip is not None:
            skip = _patterns(skip, "modules_to_not_convert")
            for p in skip:  # refused here, before any file is read, rather than at the first layer
                _regex(p, "modules_to_not_convert", _BOUNDARY)
        return cls(_block(config["weight_block_size"], "weight_block_size"), _scale_fmt(config.get("scale_fmt")), skip)


# FP8_BLOCK as compressed-tensors defines it: 128x128 e4m3 weight blocks, dynamic 1x128 activation groups.
FP8_BLOCK = LayerFormat((128, 128))


def _args(strategy: str, dynamic: bool, **fields: Any) -> dict[str, Any]:
    """A QuantizationArgs dict with the fields every compressed-tensors version knows."""
    return {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "strategy": strategy,
            "block_structure": None, "dynamic": dynamic, "actorder": None, "observer": None,
            "observer_kwargs": {}} | fields


def _group_format(group: Mapping[str, Any]) -> tuple[LayerFormat | None, str]:
    """The LayerFormat of an FP8_BLOCK-style config group, or (None, why quantcore cannot load it)."""
    w, a = group.get("weights"), group.get("input_activations")
    if not w:
        return None, "it quantizes no weights"
    if group.get("output_activations"):
        return None, "it quantizes outputs"
    weights = (str(w.get("type", "int")).lower(), w.get("num_bits"), str(w.get("strategy")).lower(),
               w.get("symmetric", True), w.get("dynamic", False), w.get("actorder"))
    if weights != ("float", 8, "block", True, False, None):
        return None, (f"its weights are type={weights[0]}, num_bits={weights[1]}, strategy={weights[2]}, "
                      f"symmetric={weights[3]}, dynamic={weights[4]}; quantcore reads FP8_BLOCK-style weights "
                      "(float, 8 bits, strategy 'block', symmetric, static)")
    block = _block(w.get("block_structure"), "block_structure")
    if not a:
        return None, ("its activations stay in floating point (weight-only); QuantLinear quantizes them per "
                      "1xBk group, which would change the numerics")
    acts = (str(a.get("type", "int")).lower(), a.get("num_bits"), a.get("dynamic", False),
            str(a.get("strategy") or "group").lower(), a.get("group_size"))
    if acts != ("float", 8, True, "group", block[1]):
        return None, (f"its activations are type={acts[0]}, num_bits={acts[1]}, dynamic={acts[2]}, "
                      f"strategy={acts[3]}, group_size={acts[4]}; QuantLinear quantizes them to FP8 dynamically "
                      f"per 1x{block[1]} group (the weight's K block)")
    return LayerFormat(block), ""


@dataclass(frozen=True)
class _Group:
    name: str
    targets: tuple[str, ...]
    format: LayerFormat | None
    problem: str


@dataclass(frozen=True)
class CompressedTensorsScheme:
    """`quant_method: "compressed-tensors"`: each linear takes the config group whose targets match it
    (an exact name before a `re:` regex before the class "Linear"), unless `ignore` matches it; the
    group must be FP8_BLOCK-style. Scales are named `weight_scale`."""

    groups: tuple[_Group, ...]
    ignore: tuple[str, ...] = ()
    method: ClassVar[str] = "compressed-tensors"
    scale_name: ClassVar[str] = "weight_scale"

    @classmethod
    def fp8_block(cls, block_size: tuple[int, int], ignore: tuple[str, ...]) -> CompressedTensorsScheme:
        """One group quantizing every linear but `ignore` in (Bn, Bk) blocks (FP8_BLOCK for 128x128)."""
        return cls((_Group("group_0", ("Linear",), LayerFormat(tuple(block_size)), ""),), tuple(ignore))

    def layer(self, name: str) -> LayerFormat | None:
        """The format of linear `name`, or None when the config keeps it in floating point; raises when
        its group is one quantcore cannot compute."""
        if any(compressed_tensors_matches(name, t) for t in self.ignore):
            return None
        ranked = [(0 if t == name else 1 if t.startswith("re:") else 2, g) for g in self.groups for t in g.targets
                  if compressed_tensors_matches(name, t)]
        if not ranked:
            return None
        group = min(ranked, key=lambda r: r[0])[1]
        if group.format is None:
            raise _fail(f"config group {group.name!r} covers {name!r}, but {group.problem}")
        return group.format

    def to_config(self) -> dict[str, Any]:
        """The `quantization_config` dict compressed-tensors, transformers and vLLM read."""
        groups = {}
        for g in self.groups:
            bn, bk = g.format.block_size
            groups[g.name] = {"targets": list(g.targets),
                              "weights": _args("block", False, block_structure=[bn, bk]),
                              "input_activations": _args("group", True, group_size=bk),
                              "output_activations": None}
        return {"quant_method": "compressed-tensors", "format": "float-quantized",
                "quantization_status": "compressed", "config_groups": groups, "ignore": list(self.ignore),
                "kv_cache_scheme": None, "global_compression_ratio": None}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> CompressedTensorsScheme:
        """Read a `quant_method: "compressed-tensors"` dict (groups are checked when a layer uses them)."""
        if config.get("format", "float-quantized") not in ("float-quantized", "naive-quantized"):
            raise _fail(f"compressed-tensors format {config['format']!r}: quantcore reads 'float-quantized' "
                        "(FP8 codes stored as float8_e4m3fn)")
        if config.get("quantization_status", "compressed") != "compressed":
            raise _fail(f"quantization_status {config['quantization_status']!r}: the weights are not stored "
                        "quantized ('compressed'); load them into the float model and call quantize_model")
        if config.get("kv_cache_scheme"):
            raise _fail("kv_cache_scheme is set: quantcore quantizes linear layers only, not the KV cache")
        raw = config.get("config_groups")
        if not isinstance(raw, Mapping) or not raw:
            raise _fail("compressed-tensors config has no config_groups")
        groups = []
        for name, group in raw.items():
            if isinstance(group, (list, tuple)):  # a preset's name mapped to its targets
                fmt = FP8_BLOCK if name.upper() == "FP8_BLOCK" else None
                groups.append(_Group(name, _patterns(group, "targets"), fmt, f"preset {name!r} is not FP8_BLOCK"))
            else:
                groups.append(_Group(name, _patterns(group.get("targets") or (), "targets"), *_group_format(group)))
        ignore = _patterns(config.get("ignore") or (), "ignore")
        for target in (*ignore, *(t for g in groups for t in g.targets)):
            if target.startswith("re:"):  # refused here, before any file is read, rather than at the first layer
                _regex(target[3:], _CT_KEY)
        return cls(tuple(groups), ignore)


SCHEMES = {s.method: s for s in (Fp8Scheme, CompressedTensorsScheme)}
Scheme = Fp8Scheme | CompressedTensorsScheme


def scheme_from_config(config: Mapping[str, Any]) -> Scheme:
    """The scheme of a `quantization_config` dict (config.json's entry of that name)."""
    if not isinstance(config, Mapping):
        raise _fail(f"expected a dict (config.json's quantization_config), got {type(config).__name__}")
    method = config.get("quant_method")
    if method not in SCHEMES:
        raise _fail(f"quant_method {method!r} is not one quantcore loads; expected one of {sorted(SCHEMES)} "
                    "(block-FP8 checkpoints)")
    return SCHEMES[method].from_config(config)


def read_scheme(folder: str | os.PathLike) -> Scheme:
    """The scheme of the checkpoint folder's `config.json`."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise _fail(f"no {CONFIG_FILE} in {str(folder)!r}; a Hugging Face checkpoint folder has one with a "
                    "quantization_config (for bare safetensors files use quantcore.nn.load_fp8_checkpoint)")
    config = read_json(path, _OP)
    if "quantization_config" not in config:
        raise _fail(f"{path} has no quantization_config: the checkpoint is not quantized; load it into the "
                    "float model and call quantize_model")
    return scheme_from_config(config["quantization_config"])
