"""`SafetensorsFiles`: the tensors of a safetensors checkpoint (a file, or a folder of shards) by name.

The file-level half of checkpoint loading, with no notion of quantization: which shard holds a
tensor (from `model.safetensors.index.json` when the folder has one), and reading a tensor, or only a
slice of it, with `safetensors.safe_open`. Files are memory-mapped: a read copies just the requested
bytes onto the target device, and at most one shard is open at a time. `quantcore.nn.load_checkpoint`
streams shard by shard through it; tensor-parallel layers read their rank's rows or columns with
`get(name, index)`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import InvalidInputError

INDEX_FILE = "model.safetensors.index.json"


def read_json(path: Path, op: str) -> dict:
    """The JSON object in `path` (a checkpoint's config or index); `InvalidInputError` naming the file
    when it is not valid JSON or not an object."""
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidInputError(f"{op}: {path} is not valid JSON ({err}); repair or replace the file") from None
    if not isinstance(value, dict):
        raise InvalidInputError(f"{op}: {path} holds a JSON {type(value).__name__}, expected an object {{...}}")
    return value


class SafetensorsFiles:
    """The tensors of `path` by name: a `.safetensors` file, or a folder holding
    `model.safetensors.index.json` (its `weight_map` names each tensor's shard) or else `*.safetensors`
    files. `device`: where reads land ("cpu", "cuda:0", ...). `op`: the name errors start with (the
    public function reading through it). Use as a context manager, or call `close()`, to release the
    open shard."""

    def __init__(self, path: str | os.PathLike, device: torch.device | str = "cpu", *, op: str = "SafetensorsFiles"):
        self.path = Path(path)
        self.op = op
        self.device = str(torch.device(device))
        self._open: tuple[Path, Any] | None = None
        self._shard: dict[str, Path] = {}
        index = self.path / INDEX_FILE
        if self.path.is_dir() and index.is_file():
            weight_map = read_json(index, self.op).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise InvalidInputError(f"{self.op}: {index} has no weight_map {{tensor name: shard file}}; rewrite the "
                                        "index or remove it to read every *.safetensors file of the folder")
            self._shard = {name: self.path / shard for name, shard in weight_map.items()}
            absent = sorted({str(f) for f in self._shard.values() if not f.is_file()})
            if absent:
                raise InvalidInputError(f"{self.op}: {index} names shard(s) that do not exist: {', '.join(absent[:5])}")
        else:
            files = sorted(self.path.glob("*.safetensors")) if self.path.is_dir() else [self.path]
            if not files or not all(f.is_file() for f in files):
                raise InvalidInputError(f"{self.op}: no safetensors file at {str(self.path)!r}; pass a .safetensors "
                                        "file or a folder holding them (with or without model.safetensors.index.json)")
            for f in files:
                for name in self._handle(f).keys():
                    if name in self._shard:
                        raise InvalidInputError(f"{self.op}: tensor {name!r} is in both {self._shard[name].name} and "
                                                f"{f.name}; a checkpoint names each tensor once")
                    self._shard[name] = f

    def names(self) -> list[str]:
        """Every tensor's name, grouped by shard (shards in file-name order)."""
        return [name for _, names in self.shards() for name in names]

    def shards(self) -> list[tuple[Path, list[str]]]:
        """(shard file, the names it holds) for each shard, in file-name order: read a shard's tensors
        together to open each file once."""
        by_file: dict[Path, list[str]] = {}
        for name, f in self._shard.items():
            by_file.setdefault(f, []).append(name)
        return sorted(by_file.items())

    def __contains__(self, name: object) -> bool:
        return name in self._shard

    def shard_of(self, name: str) -> Path:
        """The file holding tensor `name`."""
        if name not in self._shard:
            raise InvalidInputError(f"{self.op}: no tensor named {name!r} in {str(self.path)!r}")
        return self._shard[name]

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor `name`, read from its shard's header (no data is read)."""
        return tuple(self._handle(self.shard_of(name)).get_slice(name).get_shape())

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape, from the shard headers (each shard opened once, no data read)."""
        return {name: self.shape(name) for name in self.names()}

    def get(self, name: str, index: tuple[slice, ...] | None = None) -> torch.Tensor:
        """Tensor `name` on `device`; with `index` (a tuple of step-1 slices, one per leading dim, e.g.
        `(slice(0, 512),)` for the first 512 rows or `(slice(None), slice(256, 512))` for columns) only
        that part of it is read."""
        handle = self._handle(self.shard_of(name))
        if index is None:
            return handle.get_tensor(name)
        return handle.get_slice(name)[index]

    def close(self) -> None:
        """Release the open shard (its memory map)."""
        self._open = None

    def __enter__(self) -> SafetensorsFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handle(self, f: Path) -> Any:
        if self._open is None or self._open[0] != f:
            from safetensors import SafetensorError, safe_open  # optional dependency: the `hf` extra

            try:
                self._open = (f, safe_open(str(f), framework="pt", device=self.device))
            except SafetensorError as err:  # a truncated or corrupt file
                raise InvalidInputError(f"{self.op}: cannot read {f} as safetensors ({err}); the file is damaged or "
                                        "not a safetensors file") from None
        return self._open[1]
