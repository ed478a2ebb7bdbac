"""`SafetensorsFiles`: the tensors of a safetensors checkpoint (a file, or a folder of shards) by name;
`write_folder`: a folder's files written all at once or not at all.

The file-level half of checkpoints, with no notion of quantization: which shard holds a tensor (from
`model.safetensors.index.json` when the folder has one), and reading a tensor, or only a slice of it,
with `safetensors.safe_open`. Files are memory-mapped: a read copies just the requested bytes onto
the target device, and at most one shard is open at a time. `quantcore.nn.load_checkpoint` streams
shard by shard through it; tensor-parallel layers read their rank's rows or columns with
`get(name, index)`. `quantcore.nn.save_checkpoint` writes through `write_folder`.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import importlib
import json
import os
import re
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from ..errors import CheckpointWriteError, InvalidInputError, MissingDependencyError

INDEX_FILE = "model.safetensors.index.json"
# The i-th of N shards as transformers and huggingface_hub name them.
NUMBERED_SHARD = re.compile(r"(.+)-(\d{5})-of-(\d{5})\.safetensors")


def safetensors_module(name: str, op: str) -> Any:
    """`safetensors` or one of its submodules (an optional dependency: the `hf` extra), imported;
    `MissingDependencyError` saying what to install when it is not there."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("safetensors"):
            raise
        raise MissingDependencyError(f"{op}: checkpoints are read and written with the safetensors package, which "
                                     "is not installed: pip install 'quantcore[hf]' (or pip install safetensors)"
                                     ) from None


def _read_device(device: Any, op: str) -> str:
    """`device` as the string safetensors reads onto; `InvalidInputError` for what is no device or no
    device here (torch and safetensors would raise an AssertionError or a pin_memory RuntimeError)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InvalidInputError(f"{op}: device={device!r} is not a device ({err}); pass 'cpu', 'cuda' or "
                                "'cuda:<index>'") from None
    if dev.type == "cpu":
        return "cpu"  # safetensors refuses "cpu:0"
    if dev.type == "meta":
        raise InvalidInputError(f"{op}: device='meta' holds no data, so nothing can be read onto it; pass device='cpu' "
                                "or a GPU (a model built on the meta device takes the loaded tensors as they are)")
    backend = getattr(torch, dev.type, None)
    available = backend is not None and hasattr(backend, "is_available") and backend.is_available()
    count = backend.device_count() if available else 0
    if (dev.index or 0) >= count:
        raise InvalidInputError(f"{op}: device={device!r}, but torch sees {count} {dev.type} device(s) here; pass "
                                "device='cpu' or a device this machine has")
    return str(dev)


def _inside(folder: Path, name: str, op: str, source: str) -> Path:
    """`folder / name`, for a shard name read from `source`; `InvalidInputError` unless the file lies
    inside `folder`, symlinks followed, so that a checkpoint cannot make its loader read another one."""
    root = folder.resolve()
    roots = [root]
    if root.parent.name == "snapshots":  # the Hugging Face cache: snapshots/<revision>/<file> -> ../../blobs/<hash>
        roots.append(root.parent.parent / "blobs")
    rel = Path(name)
    try:
        inside = bool(name) and not rel.is_absolute() and ".." not in rel.parts and \
            any((root / rel).resolve().is_relative_to(r) for r in roots)
    except (OSError, ValueError, RuntimeError):  # a NUL byte in the name, a symlink loop
        inside = False
    if not inside:
        raise InvalidInputError(f"{op}: shard {name!r} ({source}) is not a file inside the checkpoint folder "
                                f"{str(folder)!r} (an absolute path, '..' or a symlink leading out); a checkpoint's "
                                "shards live in its folder: repair the index, or copy the shards in")
    return folder / rel


def _missing_shards(files: Iterable[Path]) -> list[str]:
    """The files of each numbered series (`model-00002-of-00003.safetensors`) among `files` that are not there."""
    series = {(f.parent, m.group(1), int(m.group(3))) for f in files if (m := NUMBERED_SHARD.fullmatch(f.name))}
    expected = {folder / f"{stem}-{i:05d}-of-{total:05d}.safetensors" for folder, stem, total in series
                for i in range(1, total + 1)}
    return sorted(str(f) for f in expected if not f.is_file())


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
    open shard.

    A folder is checked before any shard is opened, raising `InvalidInputError`: every shard must be
    a file inside it (no absolute path, no '..', no symlink leading out, except the Hugging Face
    cache's links from snapshots/ into blobs/), and a numbered series (`model-00001-of-00003...`)
    must be whole, with or without an index."""

    def __init__(self, path: str | os.PathLike, device: torch.device | str = "cpu", *, op: str = "SafetensorsFiles"):
        self.path = Path(path)
        self.op = op
        self.device = _read_device(device, op)
        self._safetensors = safetensors_module("safetensors", op)
        self._open: tuple[Path, Any] | None = None
        self._shard: dict[str, Path] = {}
        index = self.path / INDEX_FILE
        if self.path.is_dir() and index.is_file():
            weight_map = read_json(index, self.op).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise InvalidInputError(f"{self.op}: {index} has no weight_map {{tensor name: shard file}}; rewrite the "
                                        "index or remove it to read every *.safetensors file of the folder")
            odd = next(((name, shard) for name, shard in weight_map.items() if not isinstance(shard, str)), None)
            if odd is not None:
                raise InvalidInputError(f"{self.op}: {index} maps tensor {odd[0]!r} to {odd[1]!r}; weight_map's "
                                        "values are shard file names (strings): repair the index")
            files = {shard: _inside(self.path, shard, op, f"named in {index}") for shard in set(weight_map.values())}
            self._shard = {name: files[shard] for name, shard in weight_map.items()}
            absent = sorted({str(f) for f in files.values() if not f.is_file()})
            if absent:
                raise InvalidInputError(f"{self.op}: {index} names shard(s) that do not exist: {', '.join(absent[:5])}")
            self._check_whole(files.values())
        else:
            files = sorted(self.path.glob("*.safetensors")) if self.path.is_dir() else [self.path]
            if not files or not all(f.is_file() for f in files):
                raise InvalidInputError(f"{self.op}: no safetensors file at {str(self.path)!r}; pass a .safetensors "
                                        "file or a folder holding them (with or without model.safetensors.index.json)")
            if self.path.is_dir():
                for f in files:
                    _inside(self.path, f.name, op, "a link in the folder")
                self._check_whole(files)
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

    def _check_whole(self, files: Iterable[Path]) -> None:
        # Also with strict=False: that is about the model's keys, and a partial set of shards would load
        # silently as a model whose missing weights keep their initial values.
        missing = _missing_shards(files)
        if missing:
            raise InvalidInputError(f"{self.op}: the checkpoint at {str(self.path)!r} is incomplete: "
                                    f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} missing "
                                    f"({len(missing)} file(s) of a numbered series); copy or download the missing "
                                    "shards")

    def _handle(self, f: Path) -> Any:
        if self._open is None or self._open[0] != f:
            try:
                self._open = (f, self._safetensors.safe_open(str(f), framework="pt", device=self.device))
            except self._safetensors.SafetensorError as err:  # a truncated or corrupt file
                raise InvalidInputError(f"{self.op}: cannot read {f} as safetensors ({err}); the file is damaged or "
                                        "not a safetensors file") from None
        return self._open[1]


def write_folder(folder: str | os.PathLike, writers: Mapping[str, Callable[[Path], None]], *,
                 stale: Sequence[str] = (), op: str = "write_folder", size: int = 0) -> None:
    """Write files into `folder` so that a crash, a kill or a full disk never leaves part of them.

    writers: {file name: a function writing that file at the path it is given}, called in order into
    a fresh sibling folder (`.<name>.tmp-<host>-<pid>-<random>`, on the same file system; inside
    `folder` when that is a mount point or its parent is read-only to us), each file and then the
    folder synced to disk. When `folder` does not exist or is empty, one rename then puts the whole
    set in place. Otherwise the `stale` files of `folder` are removed, in order, and the new ones
    moved in, in order, each with one rename: a caller puts the file that marks the set as whole last
    in `writers` and first in `stale` (for checkpoints, config.json). The staging folder is removed
    on any failure, KeyboardInterrupt included; those of killed writers on this host are removed by
    the next call for the same folder. An `OSError` (a full disk, no permission) becomes a `CheckpointWriteError`
    naming the folder and saying what state it is in; `size`: the bytes being written, for that
    message.
    """
    folder = Path(folder)
    target = Path(os.path.realpath(folder))
    staging = None
    placed = "nothing"
    try:
        staging = _new_staging(target)
        for name, write in writers.items():
            write(staging / name)
            _sync(staging / name)
        _sync(staging)
        # POSIX rename(2) replaces an empty folder, so every file appears at once; but not the working
        # directory, which would leave this process in a deleted folder.
        empty = os.name == "posix" and target.is_dir() and not any(target.iterdir()) and target != Path.cwd()
        if staging.parent != target and (empty or not target.exists()):
            os.replace(staging, target)
        else:
            placed = "part"
            for name in stale:
                (target / name).unlink(missing_ok=True)
            for name in writers:
                os.replace(staging / name, target / name)
            _sync(target)
        placed = "all"
        _sync(target.parent)
    except OSError as err:
        full = err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
        state = {"nothing": "it is as it was, and nothing was left behind",
                 "part": "part of its old files may be replaced by new ones: write it again",
                 "all": "the files are in place, but may not all be on disk yet"}[placed]
        amount = f"{size / 1e9:.1f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"
        todo = f"free {amount} or more there and try again" if full else "make it writable and try again"
        raise CheckpointWriteError(err.errno, f"{op}: could not write into {str(folder)!r}: "
                                              f"{'the disk is full' if full else 'the file system refused'} ({err}); "
                                              f"{state}; {todo}") from err
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _new_staging(target: Path) -> Path:
    """A new, empty folder to write `target`'s files into where a rename reaches `target`: beside it,
    or inside it when it is a mount point (another file system) or its parent is not ours to write in."""
    homes = [] if target.is_dir() and os.path.ismount(target) else [target.parent]
    homes += [target] if target.is_dir() else []
    for home in homes[:-1]:
        try:
            return _make_staging(home, target)
        except OSError as err:
            if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
    return _make_staging(homes[-1], target)


def _make_staging(home: Path, target: Path) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    _remove_dead_staging(home, target)
    path = home / f"{_staging_prefix(target)}{_HOST}-{os.getpid()}-{secrets.token_hex(8)}"
    path.mkdir()  # the mode the umask gives, as a folder made by hand would have
    return path


def _staging_prefix(target: Path) -> str:
    return f".{target.name[:64]}.tmp-"


# The host in staging names, hashed: a short name that a shared file system's other hosts do not match.
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _remove_dead_staging(home: Path, target: Path) -> None:
    """Remove the staging folders for `target` in `home` of writers on this host whose process is gone
    (killed with SIGKILL or SIGTERM, or the machine restarted); those of live writers stay."""
    if os.name != "posix":  # os.kill(pid, 0) only asks whether a process exists on POSIX
        return
    prefix = _staging_prefix(target)
    for path in home.glob(glob.escape(prefix) + "*"):
        host, _, rest = path.name[len(prefix):].partition("-")
        pid = rest.partition("-")[0]
        if host == _HOST and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _sync(path: Path) -> None:
    """Flush a written file, or a folder's entries, to the disk."""
    if path.is_dir() and os.name != "posix":  # only POSIX opens a folder to sync it
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        # Some file systems cannot sync a folder (EINVAL); the files in it were synced one by one.
        if not (path.is_dir() and err.errno in (errno.EINVAL, errno.ENOTSUP)):
            raise
    finally:
        os.close(fd)
