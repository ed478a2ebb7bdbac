"""Measured backend priorities per GPU model: shipped with the package under
`quantcore/data/priority/`, and written by `quantcore bench --write-priority` into the user's data
folder (`quantcore.userdirs.data_dir()/priority`, `QUANTCORE_DATA_DIR` moves it), never into the
installed package. A table there takes precedence over the shipped one for its GPU model.

A file maps "op/format" to {M bucket: [implementation labels, fastest first]} ("priority"), and for
GEMMs, whose ranking changes with K too, optionally "op/format" to {K bucket: {M bucket: labels}}
("by_k", ranked over the shapes of each K bucket alone). Only the implementations that were measured
are listed; the registry appends the rest in default order. A run that ranks some op/format pairs
(`--ops`, `--moe`) leaves the others' entries as the table in force had them.
"""

from __future__ import annotations

import functools
import json
import math
import re
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from .. import userdirs

DATA = "data/priority"


@dataclass(frozen=True)
class Table:
    """One GPU model's measured priorities: {"op/format": {M bucket: labels}}, and `by_k` {"op/format":
    {K bucket: {M bucket: labels}}} where a GEMM's ranking was also built per K bucket, for GPU `device`
    of architecture `arch` ("sm_90"; None in tables written before it was recorded), read from `path`
    (`shipped`: the package's own table, else the user's); `source` says which runs measured it."""

    device: str
    arch: str | None
    path: str
    shipped: bool
    priority: dict[str, dict[int, tuple[str, ...]]]
    by_k: dict[str, dict[int, dict[int, tuple[str, ...]]]] = field(default_factory=dict)
    source: str = ""


def device_slug(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3": the data file's name."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def user_folder() -> Path:
    """Where `quantcore bench --write-priority` writes tables and the registry looks first."""
    return userdirs.data_dir() / "priority"


def load(device_name: str) -> Table | None:
    """The table in force for a GPU model: the user's if there is one, else the shipped one, else None."""
    return _load(device_slug(device_name), str(user_folder()))


def tables() -> list[Table]:
    """Every GPU model's table in force (the user's before the shipped one), by file name."""
    folders = (Path(str(resources.files("quantcore").joinpath(DATA))), user_folder())
    slugs = sorted({p.stem for folder in folders if folder.is_dir() for p in folder.glob("*.json")})
    return [t for t in (_load(slug, str(user_folder())) for slug in slugs) if t is not None]


@functools.lru_cache(maxsize=None)
def _load(slug: str, folder: str) -> Table | None:
    user = Path(folder) / f"{slug}.json"
    shipped = resources.files("quantcore").joinpath(f"{DATA}/{slug}.json")
    for path, is_shipped in ((user, False), (shipped, True)):
        if not path.is_file():
            continue
        try:
            device, arch, priority, by_k, source = _read(path, slug)
        except (OSError, ValueError) as err:
            # Read on every op call on a GPU (through the selection cache): one bad file written by hand or
            # cut short by a full disk must not fail them all. The shipped table still applies. Warned once
            # per reading (this function's cache), so once a process unless the tables are forgotten.
            warnings.warn(f"quantcore: ignoring the measured priority table {path}: {err}; the shipped table and "
                          "the default priority apply instead. Delete the file or write it again with "
                          "`quantcore bench --write-priority`")
            continue
        return Table(device, arch, str(path), is_shipped, priority, by_k, source)
    return None


def _read(path: Any, slug: str) -> tuple[str, str | None, dict, dict, str]:
    """(device, arch, priority, by_k, source) of a table file, or ValueError saying what is malformed."""
    try:
        data = json.loads(path.read_text())
    except ValueError as err:  # undecodable text too
        raise ValueError(f"not valid JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("priority"), dict):
        raise ValueError('expected a JSON object with a "priority" object ({"op/format": {M bucket: [labels]}})')
    device, arch = data.get("device", slug), data.get("arch")
    if not isinstance(device, str) or not (arch is None or isinstance(arch, str)):
        raise ValueError('"device" must be a string and "arch" a string or null')
    by_k = data.get("by_k", {})
    if not isinstance(by_k, dict):
        raise ValueError('"by_k" must be an object ({"op/format": {K bucket: {M bucket: [labels]}}})')
    priority = {key: _by_m(by_m, f"priority[{key!r}]") for key, by_m in data["priority"].items()}
    by_k = {key: _buckets(per_k, f"by_k[{key!r}]", _by_m) for key, per_k in by_k.items()}
    return device, arch, priority, by_k, str(data.get("source", ""))


def _buckets(value: Any, where: str, entry: Callable[[Any, str], Any]) -> dict[int, Any]:
    """A non-empty {bucket: entry} object with integer bucket keys ("128"), each entry read by `entry`."""
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{where} must be a non-empty object keyed by bucket")
    out = {}
    for bucket, item in value.items():
        try:
            number = int(bucket)
        except ValueError:
            raise ValueError(f"{where} has bucket {bucket!r}, not an integer") from None
        out[number] = entry(item, f"{where}[{bucket!r}]")
    return out


def _labels(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be a list of implementation labels, got {value!r}")
    return tuple(value)


def _by_m(by_m: Any, where: str) -> dict[int, tuple[str, ...]]:
    return _buckets(by_m, where, _labels)


def forget() -> None:
    """Read the tables again on next use (after one was written)."""
    _load.cache_clear()


def table(device_name: str) -> dict[str, dict[int, tuple[str, ...]]]:
    """The measured priorities in force for a GPU model (`load`), or {} when there are none."""
    found = load(device_name)
    return found.priority if found else {}


def table_by_k(device_name: str) -> dict[str, dict[int, dict[int, tuple[str, ...]]]]:
    """The per-K GEMM rankings in force for a GPU model (`Table.by_k`), or {} when there are none."""
    found = load(device_name)
    return found.by_k if found else {}


def lookup(device_name: str, op: str, fmt: str, m_bucket: int, k_bucket: int | None = None) -> tuple[str, ...] | None:
    """Measured order for a call, taking the nearest measured bucket at or below `m_bucket` (and, for a
    GEMM of K bucket `k_bucket` whose table was built per K, the nearest K bucket at or below `k_bucket`)."""
    per_k = table_by_k(device_name).get(f"{op}/{fmt}") if k_bucket is not None else None
    if per_k:
        by_m = per_k[_at_or_below(per_k, k_bucket)]
        if min(by_m) <= m_bucket:  # per-K rankings start at some M: below it, the one over every K
            return by_m[_at_or_below(by_m, m_bucket)]
    by_m = table(device_name).get(f"{op}/{fmt}")
    if not by_m:
        return None
    return by_m[_at_or_below(by_m, m_bucket)]


def _at_or_below(buckets, bucket: int) -> int:
    """The nearest of `buckets` at or below `bucket`, else the smallest."""
    below = [b for b in buckets if b <= bucket] or [min(buckets)]
    return max(below)


def build(records, m_of) -> dict[str, dict[str, list[str]]]:
    """Orders from bench records: per (op, fmt, M bucket), implementations by geometric-mean time.

    `records` are bench Records of quantcore's own implementations; `m_of(record)` gives its bucket.
    An implementation missing a shape of the bucket is ranked after those that ran them all.
    """
    return _ranked(records, lambda r: (f"{r.op}/{r.fmt}", m_of(r)))


def build_by_k(records, m_of, k_of) -> dict[str, dict[str, dict[str, list[str]]]]:
    """`build` per K bucket as well: {"op/fmt": {K bucket: {M bucket: labels}}} over the records for which
    `k_of(record)` gives a bucket (None: the op's ranking does not depend on K)."""
    keyed = [r for r in records if k_of(r) is not None]
    ranked = _ranked(keyed, lambda r: ((f"{r.op}/{r.fmt}", k_of(r)), m_of(r)))
    out: dict[str, dict[str, dict[str, list[str]]]] = defaultdict(dict)
    for (opfmt, k), by_m in sorted(ranked.items(), key=lambda item: item[0][1]):
        out[opfmt][str(k)] = by_m
    return dict(out)


def _as_json(by_m: dict[int, tuple[str, ...]]) -> dict[str, list[str]]:
    """{M bucket: labels} as a table file holds it."""
    return {str(m): list(labels) for m, labels in by_m.items()}


def _ranked(records, key_of) -> dict:
    """{key: {M bucket: labels by geometric-mean time}} for `key_of(record)` = (key, M bucket)."""
    times: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    shapes: dict[tuple, set] = defaultdict(set)
    for r in records:
        if r.us is None:
            continue
        key = key_of(r)
        times[key][r.impl].append(math.log(r.us))
        shapes[key].add(tuple(r.shape))
    out: dict = defaultdict(dict)
    for (group, m), by_impl in sorted(times.items()):
        n = len(shapes[(group, m)])
        ranked = sorted(by_impl, key=lambda i: (len(by_impl[i]) < n, sum(by_impl[i]) / len(by_impl[i])))
        out[group][str(m)] = ranked
    return dict(out)


def write(device_name: str, priority: dict, source: str, root: Path | None = None, arch: str | None = None,
          by_k: dict | None = None) -> Path:
    """Write a priority table for `device_name` (of architecture `arch`, "sm_90"; `by_k` its per-K GEMM
    rankings, `build_by_k`) into folder `root` (default `user_folder()`, which the registry reads) as
    `<device slug>.json`, whole or not at all, and return its path. The op/format pairs that `priority` does not
    rank keep their entries (and per-K rankings) from the table in force for the device, the user's else the
    shipped one; a pair it ranks is replaced whole."""
    path = (user_folder() if root is None else Path(root)) / f"{device_slug(device_name)}.json"
    kept = load(device_name)
    if kept is not None and set(kept.priority) - set(priority):
        others = sorted(set(kept.priority) - set(priority))
        priority = {**{key: _as_json(kept.priority[key]) for key in others}, **priority}
        by_k = {**{key: {str(k): _as_json(by_m) for k, by_m in kept.by_k[key].items()}
                   for key in others if key in kept.by_k}, **(by_k or {})}
        source = f"{source}; the other entries from: {kept.source or kept.path}"
    data = {"device": device_name, "arch": arch or (kept and kept.arch), "source": source, "priority": priority}
    if by_k:
        data["by_k"] = by_k
    text = json.dumps(data, indent=1) + "\n"
    userdirs.write_atomically(path, text.encode())
    forget()
    return path
