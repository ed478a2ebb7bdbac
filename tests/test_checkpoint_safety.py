"""Checkpoints against careless and hostile input, and saves that cannot be half done: a save killed,
interrupted or out of disk leaves the folder as it was and a retry succeeds, a folder's files are
replaced only with overwrite=True; config patterns whose matching time is bounded, block sizes that
must be ints, shard sets that must be whole and inside their folder, block scales that must be
finite and > 0, devices that must exist, a missing safetensors package named as such."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch
from torch import nn

from quantcore import InvalidInputError
from quantcore.errors import CheckpointWriteError, MissingDependencyError
from quantcore.nn import load_checkpoint, load_fp8_checkpoint, quantize_model, save_checkpoint, scheme_from_config
from quantcore.nn.schemes import compressed_tensors_matches, transformers_skips
from quantcore.parallel import load_tp_checkpoint, read_safetensors, shard_model

FP8 = torch.float8_e4m3fn
FP8_CONFIG = {"quant_method": "fp8", "weight_block_size": [128, 128]}
INDEX = "model.safetensors.index.json"


class Small(nn.Module):
    """Two 128-block linears and a float head: a checkpoint of a few shards in milliseconds."""

    def __init__(self):
        super().__init__()
        self.up, self.down, self.lm_head = nn.Linear(256, 128), nn.Linear(128, 256), nn.Linear(256, 32, bias=False)


def small(seed=0) -> nn.Module:
    torch.manual_seed(seed)
    return quantize_model(Small().bfloat16().requires_grad_(False), dtype=FP8)


def meta_small() -> nn.Module:
    with torch.device("meta"):
        return Small().bfloat16()


def sharded(folder, seed=0):
    """A checkpoint of several numbered shards and their index."""
    save_checkpoint(small(seed), folder, max_shard_size="40KB")
    assert len(set(json.loads((folder / INDEX).read_text())["weight_map"].values())) >= 3
    return folder


def rewrite_index(folder, change):
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"] = change(index["weight_map"])
    (folder / INDEX).write_text(json.dumps(index))


def every_loader(folder, **kwargs):
    """Each public way of reading `folder`, with strict=False where the loader has it."""
    return [lambda: load_checkpoint(meta_small(), folder, strict=False, **kwargs),
            lambda: load_checkpoint(None, folder, **kwargs),
            lambda: load_fp8_checkpoint(small(), folder, strict=False),
            lambda: read_safetensors(folder, {})]


def listing(folder):
    """{file name: bytes} of a folder's files."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def no_staging_left(folder):
    return not [p for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.tmp-")]


def user_folder(tmp_path):
    """A folder a user keeps a float model in: config.json and pytorch_model.bin."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "small"}')
    (folder / "pytorch_model.bin").write_bytes(b"float weights")
    return folder


# Saving: atomic, never clobbering


@pytest.mark.parametrize("only_config", [False, True])
def test_a_folder_with_a_config_is_refused_untouched_and_overwrite_replaces_only_the_checkpoint(tmp_path, only_config):
    folder = user_folder(tmp_path)
    if only_config:
        (folder / "pytorch_model.bin").unlink()
    before = listing(folder)
    with pytest.raises(InvalidInputError, match=r"already holds a checkpoint's files \(config\.json\), which this "
                                                r"save would replace; pass overwrite=True"):
        save_checkpoint(small(), folder)
    assert listing(folder) == before and no_staging_left(folder)
    save_checkpoint(small(), folder, overwrite=True)
    after = listing(folder)
    assert sorted(after) == sorted([*before, "model.safetensors"])
    assert after.get("pytorch_model.bin") == before.get("pytorch_model.bin")
    assert "quantization_config" in json.loads(after["config.json"])
    assert load_checkpoint(meta_small(), folder) == ([], []) and no_staging_left(folder)


def test_overwrite_replaces_a_sharded_checkpoint_with_a_single_file(tmp_path):
    """The old index and shards go: a loader would otherwise follow the old index or read both sets."""
    folder = sharded(tmp_path / "ckpt", seed=1)
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(InvalidInputError, match=r"\(config\.json, model\.safetensors\.index\.json, model-00001"):
        save_checkpoint(small(), folder)
    save_checkpoint(small(), folder, overwrite=True)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    loaded = load_checkpoint(None, folder)["up.weight"]
    assert torch.equal(loaded.view(torch.uint8), small().up.weight.view(torch.uint8))


def test_a_foreign_safetensors_file_is_refused_even_with_overwrite(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    safetensors.torch.save_file({"lora": torch.ones(2)}, str(folder / "adapter_model.safetensors"))
    for overwrite in (False, True):
        with pytest.raises(InvalidInputError, match="holds adapter_model.safetensors, which no quantcore checkpoint"):
            save_checkpoint(small(), folder, overwrite=overwrite)
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_model.safetensors"]


def test_a_folder_of_other_files_takes_the_checkpoint_beside_them(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    save_checkpoint(small(), folder, max_shard_size="40KB")
    assert (folder / "tokenizer.json").read_text() == "{}" and load_checkpoint(meta_small(), folder) == ([], [])


def test_an_oversized_tensor_gets_a_shard_of_its_own_and_the_rest_share(tmp_path):
    """huggingface_hub's rule: the 32 KB weights alone, every smaller tensor in one 20 KB shard."""
    folder = save_checkpoint(small(), tmp_path / "ckpt", max_shard_size=20_000)
    files: dict[str, list[str]] = {}
    for name, file in json.loads((folder / INDEX).read_text())["weight_map"].items():
        files.setdefault(file, []).append(name)
    assert sorted(map(sorted, files.values())) == [
        ["down.bias", "down.weight_scale_inv", "lm_head.weight", "up.bias", "up.weight_scale_inv"],
        ["down.weight"], ["up.weight"]]


def failing_writer(monkeypatch, error, after=1):
    """safetensors' save_file writing `after` shards, then starting the next one and raising `error`."""
    real, calls = safetensors.torch.save_file, []

    def save_file(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) > after:
            with open(path, "wb") as f:
                f.write(b"\0" * 4096)  # a partly written shard
            raise error
        real(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    return calls


@pytest.mark.parametrize("existing", [False, True])
def test_a_full_disk_leaves_the_folder_as_it_was(tmp_path, monkeypatch, existing):
    folder = user_folder(tmp_path) if existing else tmp_path / "new"
    before = listing(folder) if existing else None
    calls = failing_writer(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    match = (rf"save_checkpoint: could not write into '{re.escape(str(folder))}': the disk is full .*; it is as it "
             r"was, and nothing was left behind; free 0\.1 MB or more there and try again")
    with pytest.raises(CheckpointWriteError, match=match) as err:
        save_checkpoint(small(), folder, max_shard_size="40KB", overwrite=True)
    assert isinstance(err.value, OSError) and err.value.errno == errno.ENOSPC and len(calls) == 2
    assert (listing(folder) == before) if existing else not folder.exists()
    assert no_staging_left(folder)
    monkeypatch.undo()
    save_checkpoint(small(), folder, overwrite=True)
    assert load_checkpoint(meta_small(), folder) == ([], [])


def test_a_mount_point_is_written_from_inside(tmp_path, monkeypatch):
    """A volume mounted as the folder: no rename reaches it from its parent's file system, so the
    staging folder goes inside it, and is removed there on failure."""
    folder = tmp_path / "volume"
    folder.mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda path: os.fspath(path) == os.fspath(folder.resolve()))
    real = safetensors.torch.save_file
    calls = failing_writer(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(CheckpointWriteError, match="it is as it was"):
        save_checkpoint(small(), folder, max_shard_size="40KB")
    assert all(Path(path).parent.parent == folder.resolve() for path in calls)
    assert list(folder.iterdir()) == [] and no_staging_left(folder)
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    save_checkpoint(small(), folder, max_shard_size="40KB")
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]
    assert load_checkpoint(meta_small(), folder) == ([], [])


def test_a_folder_whose_parent_is_read_only_is_written_from_inside(tmp_path, monkeypatch):
    folder = tmp_path / "given"
    folder.mkdir()
    mkdir = Path.mkdir

    def parent_refuses(path, *args, **kwargs):
        if path.parent == tmp_path and path.name.startswith("."):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return mkdir(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", parent_refuses)
    save_checkpoint(small(), folder, max_shard_size="40KB")
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]
    assert load_checkpoint(meta_small(), folder) == ([], [])


def test_the_working_directory_is_not_renamed_over(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_checkpoint(small(), ".")
    assert Path.cwd() == tmp_path.resolve() and sorted(os.listdir()) == ["config.json", "model.safetensors"]


def test_an_interrupted_save_cleans_up(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    failing_writer(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(small(), folder, max_shard_size="40KB")
    assert not folder.exists() and no_staging_left(folder)


def blocked_save(model, folder, written):
    """A save, in a forked child, that stops for good after its first shard (until it is killed)."""
    torch.set_num_threads(1)  # a thread pool the parent used does not survive the fork
    real = safetensors.torch.save_file

    def save_file(tensors, path, metadata=None):
        real(tensors, path, metadata=metadata)
        written.set()
        time.sleep(60)

    safetensors.torch.save_file = save_file
    save_checkpoint(model, folder, max_shard_size="40KB", overwrite=True)


@pytest.mark.skipif(sys.platform != "linux", reason="forks a child to kill it")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_save_leaves_the_folder_as_it_was_and_a_retry_succeeds(tmp_path, sig):
    folder = user_folder(tmp_path)
    before = listing(folder)
    fork = multiprocessing.get_context("fork")
    written = fork.Event()
    child = fork.Process(target=blocked_save, args=(small(), folder, written))
    child.start()
    try:
        assert written.wait(timeout=10), "the child wrote no shard"
        assert listing(folder) == before
    finally:
        os.kill(child.pid, sig)
        child.join(timeout=10)
    assert child.exitcode == -sig
    assert listing(folder) == before
    if sig == signal.SIGKILL:  # no cleanup could run: the half-written staging folder is still there
        assert not no_staging_left(folder)
    save_checkpoint(small(), folder, max_shard_size="40KB", overwrite=True)  # and the retry removes it
    assert no_staging_left(folder) and load_checkpoint(meta_small(), folder) == ([], [])
    assert (folder / "pytorch_model.bin").read_bytes() == before["pytorch_model.bin"]


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


# Shard files: whole, and inside the folder


@pytest.mark.parametrize("with_index", [False, True])
def test_a_missing_shard_is_named_by_every_loader_even_without_strict(tmp_path, with_index):
    folder = sharded(tmp_path / "ckpt")
    gone = sorted(folder.glob("model-*.safetensors"))[1]
    if with_index:  # an index that leaves the shard out is no better
        rewrite_index(folder, lambda weight_map: {k: v for k, v in weight_map.items() if v != gone.name})
    else:
        (folder / INDEX).unlink()
    gone.unlink()
    for load in every_loader(folder):
        with pytest.raises(InvalidInputError, match=f"is incomplete: .*{gone.name} missing"):
            load()


@pytest.mark.parametrize("shard", ["../other/model.safetensors", "sub/../../other/model.safetensors", "ABSOLUTE", ""])
def test_an_index_cannot_point_out_of_its_folder(tmp_path, monkeypatch, shard):
    """Refused before any file is opened: the other folder's tensors would load silently."""
    other = save_checkpoint(small(seed=1), tmp_path / "other")
    folder = sharded(tmp_path / "ckpt")
    shard = str(other / "model.safetensors") if shard == "ABSOLUTE" else shard
    rewrite_index(folder, lambda weight_map: dict.fromkeys(weight_map, shard))
    opened = []
    monkeypatch.setattr(safetensors, "safe_open", lambda *args, **kwargs: opened.append(args))
    for load in every_loader(folder):
        with pytest.raises(InvalidInputError, match=f"shard {shard!r} .* is not a file inside the checkpoint folder"):
            load()
    assert not opened


def test_a_symlink_leading_out_of_the_folder_is_refused(tmp_path):
    other = save_checkpoint(small(seed=1), tmp_path / "other")
    folder = save_checkpoint(small(), tmp_path / "ckpt")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(other / "model.safetensors")
    for load in every_loader(folder):
        with pytest.raises(InvalidInputError, match="'model.safetensors' .* symlink leading out"):
            load()


def test_the_hugging_face_cache_links_snapshots_to_blobs(tmp_path):
    """snapshots/<revision>/<file> -> ../../blobs/<hash>, as huggingface_hub downloads a model."""
    saved = sharded(tmp_path / "saved")
    repo = tmp_path / "hub" / "models--org--small"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(saved.iterdir())):
        shutil.copy(f, blobs / f"blob{i}")
        (snapshot / f.name).symlink_to(os.path.join("..", "..", "blobs", f"blob{i}"))
    state = load_checkpoint(None, snapshot)
    assert set(state) == set(load_checkpoint(None, saved))
    assert load_checkpoint(meta_small(), snapshot) == ([], [])


@pytest.mark.parametrize("value", [5, None, ["model-00001-of-00003.safetensors"]])
def test_weight_map_values_must_be_file_names(tmp_path, value):
    folder = sharded(tmp_path / "ckpt")
    rewrite_index(folder, lambda weight_map: weight_map | {"up.weight": value})
    with pytest.raises(InvalidInputError, match=re.escape(f"maps tensor 'up.weight' to {value!r}; weight_map's")):
        load_checkpoint(None, folder)


# Block scales


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -0.5, float("inf")])
def test_a_scale_that_is_not_finite_and_positive_is_named(tmp_path, bad):
    model = small()
    with torch.no_grad():
        model.down.weight_scale_inv[1, 0] = bad
    folder = save_checkpoint(model, tmp_path / "ckpt")
    match = (r"block scale down\.weight_scale_inv holds 1 value\(s\) that are not finite and > 0 "
             rf"\(first: {bad} at \(1, 0\)\)")
    for load in [*every_loader(folder)[:3], lambda: load_tp_checkpoint(shard_model(small(seed=1)), folder)]:
        with pytest.raises(InvalidInputError, match=match):
            load()
    # check_scales=False loads the file as it is.
    again = meta_small()
    load_checkpoint(again, folder, check_scales=False)
    assert again.down.weight_scale_inv[1, 0].item() == pytest.approx(bad, nan_ok=True)
    assert load_checkpoint(None, folder, check_scales=False)["down.weight_scale_inv"][1, 0].isnan() == (bad != bad)
    load_fp8_checkpoint(small(seed=1), folder, check_scales=False)
    load_tp_checkpoint(shard_model(small(seed=1)), folder, check_scales=False)


def test_the_ue8m0_nan_byte_is_refused(tmp_path):
    """float8_e8m0fnu holds powers of two (never <= 0), but its byte 0xFF is NaN."""
    model = quantize_model(Small().bfloat16().requires_grad_(False), dtype=FP8, scale_fmt="ue8m0")
    folder = save_checkpoint(model, tmp_path / "ckpt", scale_dtype=torch.float8_e8m0fnu)
    path = folder / "model.safetensors"
    with safetensors.safe_open(str(path), "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    state["up.weight_scale_inv"].view(torch.uint8)[0, 1] = 0xFF
    safetensors.torch.save_file(state, str(path))
    with pytest.raises(InvalidInputError, match=r"scale up\.weight_scale_inv holds 1 .*\(first: nan at \(0, 1\)\)"):
        load_checkpoint(meta_small(), folder)


# Arguments and the environment


@pytest.mark.parametrize("device,match", [
    ("gpu", "device='gpu' is not a device"),
    ("meta", "device='meta' holds no data"),
    pytest.param("cuda", "device='cuda', but torch sees 0 cuda device", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="a GPU is here")),
    ("cuda:99", "device='cuda:99', but torch sees .* cuda device"),
])
def test_a_device_that_is_not_here_is_named(tmp_path, device, match):
    folder = save_checkpoint(small(), tmp_path / "ckpt")
    with pytest.raises(InvalidInputError, match=f"load_checkpoint: {match}"):
        load_checkpoint(meta_small(), folder, device=device)


def test_a_missing_safetensors_says_what_to_install(tmp_path, monkeypatch):
    folder = save_checkpoint(small(), tmp_path / "ckpt")
    for module in ("safetensors", "safetensors.torch"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ModuleNotFoundError
    for load in [*every_loader(folder), lambda: save_checkpoint(small(), tmp_path / "again")]:
        with pytest.raises(MissingDependencyError, match=r"safetensors package.*pip install 'quantcore\[hf\]'") as err:
            load()
        assert isinstance(err.value, ImportError)
