"""Tar shards in one process: writing (deterministic, resumable, refusing another
dataset), the reader's checks (a damaged shard, hostile members) and the epoch order that
is the same at any number of ranks and resumes exactly."""

from __future__ import annotations

import bisect
import io
import itertools
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from workload.data import shardwrite
from workload.data.loaders import TorchLoader, deal
from workload.data.shardformat import (MANIFEST, folder_files, index_name, member_header,
                                       read_manifest, shard_name)
from workload.data import shards as shards_module
from workload.data.shards import (StreamSampler, lanes_read, load_shards, rank_sampler,
                                  stream_order, verify_shards)
from workload.data.shardwrite import write_shards
from workload.data.staging import stage_once
from workload.errors import UsageError
from workload.files import sha256_file


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != ".lock"}


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


def test_the_same_source_gives_byte_identical_shards(shard_source, shard_folder, tmp_path):
    said = write_shards(shard_source, tmp_path / "again", shard_size=25)
    assert "120 training and 120 validation images in 10 shards" in said
    assert contents(tmp_path / "again") == contents(shard_folder)
    manifest = read_manifest(shard_folder)
    assert manifest["classes"] == ["cat", "class2", "dog"]
    first = manifest["splits"]["train"]["shards"][0]
    assert first["samples"] == 25 and first["sha256"] == sha256_file(shard_folder / first["name"])
    with tarfile.open(shard_folder / first["name"]) as tar:
        names = tar.getnames()[:2]
        assert {(m.mtime, m.uid, m.gid, m.uname) for m in tar} == {(0, 0, 0, "")}
    assert names == ["00000000.jpg", "00000000.cls"]


def test_a_shard_folder_is_one_file_per_shard_beside_one_index_per_split(shard_folder):
    """The point of shards on a parallel file system: a thousandth of the files."""
    manifest = read_manifest(shard_folder)
    shards = [e["name"] for split in ("train", "val") for e in manifest["splits"][split]["shards"]]
    assert sorted(p.name for p in shard_folder.iterdir()) == sorted(
        [*shards, MANIFEST, index_name("train"), index_name("val"), ".lock", ".shards-of.json"])


def test_an_interrupted_write_resumes_keeping_the_complete_shards(shard_source, shard_folder,
                                                                   tmp_path, monkeypatch):
    dest, real = tmp_path / "dest", shardwrite.write_shard
    written = []

    def stop_after_three(folder, name, chunk):
        if len(written) == 3:  # as a kill would: the fourth shard half written
            (folder / f".{name}.partial").write_bytes(b"half")
            raise KeyboardInterrupt
        written.append(name)
        return real(folder, name, chunk)

    monkeypatch.setattr(shardwrite, "write_shard", stop_after_three)
    with pytest.raises(KeyboardInterrupt):
        write_shards(shard_source, dest, shard_size=25)
    monkeypatch.setattr(shardwrite, "write_shard", real)
    assert not (dest / MANIFEST).exists()
    damaged = dest / shard_name("train", 1)
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"x")  # kept only if it still verifies
    said = write_shards(shard_source, dest, shard_size=25)
    assert "(2 complete ones kept from an earlier run)" in said
    assert {k: v for k, v in contents(dest).items() if not k.startswith(".")} == \
        {k: v for k, v in contents(shard_folder).items() if not k.startswith(".")}


def test_a_write_with_another_shard_size_keeps_no_shard_of_the_old_size(shard_source,
                                                                         shard_folder,
                                                                         tmp_path):
    dest = tmp_path / "dest"
    shutil.copytree(shard_folder, dest)
    said = write_shards(shard_source, dest, shard_size=50)
    assert "in 6 shards (0 complete ones kept" in said
    assert sorted(p.name for p in dest.glob("train-*.tar")) == [
        shard_name("train", n) for n in range(3)]
    train, _, _ = load_shards(str(dest), 8, verify=True)
    assert train.counts == [50, 50, 20]


def test_a_rewrite_keeps_dalis_indexes_and_names_what_it_removed(shard_source, shard_folder,
                                                                tmp_path):
    """D5 (issue 59): the docs' own `wds2idx train-000000.tar train-000000.idx` beside the
    shards was deleted, without a word, by a rewrite with another --shard-size."""
    dest = tmp_path / "dest"
    shutil.copytree(shard_folder, dest)
    users = {name: f"{name}: the user's DALI index\n" for name in
             ("train-000000.idx", "train-000004.idx", "val-000004.idx.json")}
    for name, text in users.items():
        (dest / name).write_text(text)
    said = write_shards(shard_source, dest, shard_size=50)
    assert all((dest / name).read_text() == text for name, text in users.items())
    assert ("removed the 4 shards of an earlier write that its index listed "
            "(train-000003.tar, train-000004.tar, val-000003.tar, ...)") in said
    assert not (dest / "train-000003.tar").exists()


def test_a_rewrite_removes_only_files_it_wrote(shard_source, shard_folder, tmp_path, caplog):
    """A shard folder may be a project's: at the names a rewrite removes, a link (to a
    file of the user's elsewhere) is not one of its shards, and a name it never wrote
    (a member's notes beside a shard) is not either; both stay, the link named."""
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    shutil.copytree(shard_folder, dest)
    elsewhere.write_bytes(b"the user's own")
    (dest / "train-000004.tar").unlink()
    (dest / "train-000004.tar").symlink_to(elsewhere)
    (dest / "train-000001.notes.txt").write_text("a member's notes")
    write_shards(shard_source, dest, shard_size=50)
    assert (dest / "train-000004.tar").is_symlink() and elsewhere.read_bytes() == b"the user's own"
    assert (dest / "train-000001.notes.txt").read_text() == "a member's notes"
    assert not (dest / "train-000003.tar").exists(), "its own stale shard removed"
    assert (f"left {dest / 'train-000004.tar'} in place: it is not a shard this folder's "
            "index lists with these bytes (a symbolic link)") in caplog.text


def test_a_folder_of_another_dataset_or_of_other_files_is_refused(shard_source, shard_folder,
                                                                  tmp_path):
    other = tmp_path / "other"
    shutil.copytree(shard_source, other)
    with pytest.raises(UsageError) as error:
        write_shards(other, shard_folder, shard_size=25)
    assert f"--shards {shard_folder} holds the shards of another dataset" in one_line(error)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="holds files that train --shards did not write"):
        write_shards(shard_source, tmp_path / "busy")
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_a_damaged_shard_is_named_in_one_line(shard_folder, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(shard_folder, copy)
    victim = copy / shard_name("val", 2)
    data = bytearray(victim.read_bytes())
    data[700] ^= 0xFF  # inside the first image's bytes
    victim.write_bytes(bytes(data))
    with pytest.raises(UsageError) as error:
        load_shards(str(copy), 8, verify=True)
    assert f"shard {victim} is damaged (its sha256 is not the one" in one_line(error)


@pytest.mark.parametrize("damage, why", [
    (lambda index, manifest: index.write_bytes(index.read_bytes().replace(b'"jpg"', b'"jpg', 1)),
     "its line of index-val.jsonl cannot be read"),
    (lambda index, manifest: manifest["splits"]["val"]["shards"][0].update(
        index=manifest["splits"]["val"]["shards"][1]["index"]),
     "its line of index-val.jsonl does not match manifest.json"),
], ids=["torn-line", "another-shards-line"])
def test_a_damaged_index_is_named_in_one_line(shard_folder, tmp_path, damage, why):
    copy = tmp_path / "copy"
    shutil.copytree(shard_folder, copy)
    manifest = read_manifest(copy)
    damage(copy / index_name("val"), manifest)
    (copy / MANIFEST).write_text(json.dumps(manifest))
    _, val, _ = load_shards(str(copy), 8)
    with pytest.raises(UsageError) as error:
        val.read(0, 0)
    assert f"shard {copy / shard_name('val', 0)} is damaged ({why}" in one_line(error)


def hostile_folder(tmp_path: Path, member: tarfile.TarInfo, data: bytes,
                   row: list | None = None) -> tuple[Path, dict]:
    """A one-sample shard folder whose first member is `member`, its manifest and index
    consistent with the shard's bytes, so that only the member itself is wrong (or the
    index's `row` for it)."""
    folder, name = tmp_path / "hostile", shard_name("train", 0)
    folder.mkdir()
    with tarfile.open(folder / name, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
        tar.addfile(member_header("00000000.cls", 1), io.BytesIO(b"0"))
    line = json.dumps(dict(shard=name, bytes=(folder / name).stat().st_size,
                           sha256=sha256_file(folder / name),
                           samples=[row or ["00000000", "jpg", 512, len(data), 0]])) + "\n"
    (folder / index_name("train")).write_text(line)
    entry = dict(name=name, samples=1, bytes=(folder / name).stat().st_size,
                 sha256=sha256_file(folder / name), index=[0, len(line)])
    manifest = dict(format="hpc-train-shards", format_version=2, classes=["a"],
                    splits=dict(train=dict(samples=1, shards=[entry]),
                                val=dict(samples=0, shards=[])))
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder, entry


def link(name: str) -> tarfile.TarInfo:
    info = member_header(name, 0)
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return info


@pytest.mark.parametrize("member, why", [
    (member_header("/00000000.jpg", 4), "has an absolute name"),
    (member_header("../00000000.jpg", 4), "leads out with '..'"),
    (link("00000000.jpg"), "is not a regular file"),
    (member_header("00000000.jpg", 64), "more than the 0 MiB a sample may have"),
    (member_header("00000007.jpg", 4), "stands where its index names '00000000.jpg'"),
], ids=["absolute", "dotdot", "link", "huge", "other-name"])
def test_a_hostile_tar_is_refused_in_one_line(tmp_path, monkeypatch, member, why):
    monkeypatch.setattr("workload.data.shardformat.MAX_MEMBER_BYTES", 32)
    # The index names a sample of a size it may have: the member itself is what is wrong.
    folder, entry = hostile_folder(tmp_path, member, b"\xff" * member.size,
                                   ["00000000", "jpg", 512, min(member.size, 32), 0])
    refused = f"shard {entry['name']} is refused: the member {member.name!r}"
    with pytest.raises(UsageError) as error:
        verify_shards(folder, read_manifest(folder))
    assert refused in one_line(error) and why in one_line(error)
    train, _, _ = load_shards(str(folder), 8)  # training reads the same headers
    with pytest.raises(UsageError) as error:
        train.read(0, 0)
    assert refused in one_line(error) and why in one_line(error)


@pytest.mark.parametrize("row", [["00000000", "jpg", 2**70, 4, 0],
                                 ["00000000", "jpg", 512, 10**12, 0]], ids=["offset", "size"])
def test_an_index_row_past_its_shard_is_damage_in_one_line(tmp_path, row):
    folder, entry = hostile_folder(tmp_path, member_header("00000000.jpg", 4), b"1234", row)
    train, _, _ = load_shards(str(folder), 8)
    with pytest.raises(UsageError) as error:  # not an OverflowError, nor a MemoryError
        train.read(0, 0)
    assert f"shard {folder / entry['name']} is damaged (its index puts sample 00000000 at " \
           f"{row[2]}, {row[3]} bytes: outside the shard's {entry['bytes']} bytes)" \
           in one_line(error)


@pytest.mark.parametrize("which", ["shard", "index"])
def test_a_fifo_in_a_shards_place_is_damage_in_one_line_not_a_hang(tmp_path, which):
    folder, entry = hostile_folder(tmp_path, member_header("00000000.jpg", 4), b"1234")
    path = folder / (entry["name"] if which == "shard" else index_name("train"))
    path.unlink()
    os.mkfifo(path)  # an open for reading would wait for a writer forever
    train, _, _ = load_shards(str(folder), 8)
    with pytest.raises(UsageError) as error:
        train.read(0, 0)
    assert f"shard {folder / entry['name']} is damaged (" in one_line(error)
    assert f"{path} is a FIFO, not a file" in one_line(error)


def test_a_refusal_in_a_dataloader_worker_is_one_line(tmp_path):
    folder, entry = hostile_folder(tmp_path, member_header("../00000000.jpg", 4), b"1234")
    train, _, _ = load_shards(str(folder), 8)
    loader = TorchLoader(train, 1, torch.device("cpu"), lambda x: x.float(), train=True,
                         seed=0, rank=0, world_size=1, workers=1,
                         sampler=StreamSampler(train.counts, 0, 0, 1, True))
    with pytest.raises(UsageError) as error:
        next(loader.batches(0))
    assert one_line(error).startswith(f"shard {entry['name']} is refused: the member")


def test_the_epoch_order_is_a_pure_function_of_seed_and_epoch():
    counts = [25, 25, 10, 25]
    order = stream_order(counts, seed=3, epoch=1, buffer=10)
    assert sorted(order) == list(range(85)) and order == stream_order(counts, 3, 1, 10)
    assert order != stream_order(counts, 3, 2, 10) != stream_order(counts, 4, 1, 10)
    # Shard-level shuffling: over epochs, the sequence starts in different shards.
    firsts = {next(j for j, s in enumerate([0, 25, 50, 60]) if o[0] < s + counts[j])
              for o in (stream_order(counts, 3, e, 10) for e in range(12))}
    assert len(firsts) > 1


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_read_a_partition_of_the_one_global_sequence(world_size):
    counts = [25, 25, 10, 25]
    whole = list(StreamSampler(counts, seed=5, rank=0, world_size=1, train=True))
    parts = [StreamSampler(counts, seed=5, rank=r, world_size=world_size, train=True)
             for r in range(world_size)]
    for part in parts:
        part.epoch = 0
    dealt = [pair for rows in zip(*(list(p) for p in parts)) for pair in rows]
    assert dealt == whole[:len(dealt)] and len(dealt) == 85 // world_size * world_size
    assert len({sample for sample, _ in dealt}) == len(dealt)  # no sample twice
    order = stream_order(counts, seed=5, epoch=0)
    assert [s for s, _ in parts[1]] == [order[p] for p in deal(torch.arange(85), 1, world_size)]


def test_a_loader_resumed_mid_epoch_yields_exactly_the_rest(shard_folder):
    train, _, classes = load_shards(str(shard_folder), 8)
    loader = TorchLoader(train, 16, torch.device("cpu"), lambda x: x.float(), train=True,
                         seed=2, rank=0, world_size=1, workers=0,
                         sampler=StreamSampler(train.counts, 2, 0, 1, True))
    whole = list(loader.batches(epoch=1))
    rest = list(loader.batches(epoch=1, start=3))
    assert len(whole) == 120 // 16 and len(rest) == len(whole) - 3
    for (images, labels), (again, same) in zip(whole[3:], rest):
        assert torch.equal(images, again) and torch.equal(labels, same)
    assert not torch.equal(whole[0][0], list(loader.batches(epoch=2))[0][0])


def test_a_shard_folder_stages_the_files_its_manifest_names_without_listing_it(
        shard_folder, tmp_path, monkeypatch):
    source = tmp_path / "shards"
    shutil.copytree(shard_folder, source)
    (source / ".train-000009.tar.partial").write_bytes(b"a writer's partial file")
    (source / ".lock").touch()

    listed, real = [], os.scandir

    def scandir(path="."):
        listed.append(str(path))
        return real(path)

    monkeypatch.setattr("os.scandir", scandir)  # os.walk, iterdir and glob list with it
    names = folder_files(read_manifest(source))
    target, said = stage_once(source, tmp_path / "local", names=names)
    assert "staged" in said and f"({len(names)} files," in said
    assert "reusing" in stage_once(source, tmp_path / "local", names=names)[1]
    monkeypatch.undo()
    assert not [path for path in listed if path.startswith(str(source))]
    assert sorted(p.name for p in target.iterdir()) == sorted(names)
    assert len(names) == 1 + 2 + 10  # the manifest, an index per split, and the shards
    train, val, classes = load_shards(str(target), 8, verify=True)
    assert len(train) == len(val) == 120 and classes == ["cat", "class2", "dog"]


def test_a_folder_that_is_no_shard_folder_is_refused_before_any_copy(shard_source, tmp_path):
    with pytest.raises(UsageError) as error:
        folder_files(read_manifest(shard_source))
    assert f"--data-dir {shard_source} has no readable manifest.json" in one_line(error)


@pytest.mark.parametrize("extra, refused", [
    ([], "--shards S packs an image folder: it goes with --dataset imagefolder"),
    (["--prepare-data", "--stage-to", "L"], "goes with --dataset imagefolder"),
    (["--prepare-data", "--shards", "SRC/shards"], "overlap (one holds the other)"),
], ids=["no-prepare-data", "stage-to", "inside-the-source"])
def test_shards_flags_out_of_place_are_refused_before_anything_runs(tmp_path, monkeypatch,
                                                                    extra, refused):
    from workload.train import parse_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "SRC").mkdir()
    args = ["--dataset", "imagefolder", "--data-dir", "SRC", "--device", "cpu"]
    shards = [] if "--shards" in extra else ["--shards", "S"]
    with pytest.raises(UsageError, match=refused.replace("(", r"\(").replace(")", r"\)")):
        parse_config([*args, *shards, *extra])


def test_a_process_keeps_only_a_few_shards_open(shard_folder, monkeypatch):
    monkeypatch.setattr("workload.data.shards.OPEN_SHARDS", 2)
    train, _, _ = load_shards(str(shard_folder), 8)
    for sample in (0, 30, 60, 90, 110, 5, 95, 31):
        alone, _, _ = load_shards(str(shard_folder), 8)  # a fresh reader of that one sample
        assert torch.equal(train[(sample, 1)][0], alone[(sample, 1)][0])
        assert len(train._open_shards) <= 2


def truncated_jpeg(path: Path) -> None:
    """A JPEG whose header and half its scan are there: PIL's verify() passes it."""
    import numpy as np
    from PIL import Image

    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3)).astype("uint8")
    Image.fromarray(noise).save(path, "JPEG")
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])


def huge_png(path: Path) -> None:
    from PIL import Image

    Image.new("1", (8000, 8000)).save(path, "PNG")  # 64 Mpixel in a few kilobytes


@pytest.mark.parametrize("bad, why", [
    (lambda path: path.write_text("not an image"), "cannot identify image file"),
    (truncated_jpeg, "image file is truncated"),
    (huge_png, "8000 x 8000 pixels is more than the 40 Mpixel"),
], ids=["text", "truncated-jpeg", "64-mpixel-png"])
def test_a_file_the_reader_refuses_is_left_out_of_the_shards_with_a_warning(
        shard_source, tmp_path, caplog, bad, why):
    source = tmp_path / "src"
    shutil.copytree(shard_source, source)
    bad(source / "train" / "dog" / "3.jpg")
    said = write_shards(source, tmp_path / "dest", shard_size=25)
    assert "119 training and 120 validation images" in said
    warning, = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert warning.startswith(f"skipping {source / 'train' / 'dog' / '3.jpg'}: it cannot be "
                              "read as an image (") and why in warning
    train, _, _ = load_shards(str(tmp_path / "dest"), 8, verify=True)
    for sample in range(len(train)):  # every image packed is one the reader takes
        train.read(*train._locate(sample))


def test_a_member_that_is_no_image_stops_the_reader_in_one_line(tmp_path):
    folder, entry = hostile_folder(tmp_path, member_header("00000000.jpg", 12), b"not an image")
    train, _, _ = load_shards(str(folder), 8, verify=True)  # well formed, as hashed
    with pytest.raises(UsageError) as error:
        train[(0, 0)]
    assert f"shard {folder / entry['name']} is damaged (sample 00000000 is not a readable " \
           "image" in one_line(error)


def test_a_tar_given_as_a_shard_folder_is_refused_before_anything_runs(tmp_path, monkeypatch):
    from workload.train import parse_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "shards.tar").write_bytes(b"")
    with pytest.raises(UsageError, match="--dataset shards reads a shard folder, and "
                                         "--data-dir shards.tar is a tar file"):
        parse_config(["--dataset", "shards", "--data-dir", "shards.tar", "--stage-to", "L",
                      "--device", "cpu"])


def shards_of(samples, counts: list[int]) -> set[int]:
    ends = list(itertools.accumulate(counts))
    return {bisect.bisect_right(ends, sample) for sample in samples}


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("counts", [[25] * 16, [25] * 15 + [13]], ids=["even", "short-last"])
def test_each_rank_reads_its_own_stretch_of_the_shards(counts, train):
    total = sum(counts)
    for world_size in (1, 2, 4, 8, 16):
        seen = []
        for rank in range(world_size):
            sampler = StreamSampler(counts, seed=7, rank=rank, world_size=world_size,
                                    train=train)
            sampler.epoch = 3
            mine = [sample for sample, _ in sampler]
            assert len(shards_of(mine, counts)) <= 16 // world_size + 2, (world_size, rank)
            seen += mine
        assert len(set(seen)) == len(seen)
        assert len(seen) == (total // world_size * world_size if train else total)
    # Where W does not divide the lanes, the sequence is kept and the ranks share shards.
    assert [lanes_read(counts, w) for w in (1, 2, 3, 12, 64)] == [16, 8, 16, 4, 1]


def test_a_ranks_reader_opens_each_of_its_shards_once_an_epoch(shard_folder, monkeypatch):
    opened = []
    real = shards_module.read_index
    monkeypatch.setattr(shards_module, "read_index", lambda folder, split, entry:
                        opened.append(entry["name"]) or real(folder, split, entry))
    train, _, _ = load_shards(str(shard_folder), 8)
    loader = TorchLoader(train, 8, torch.device("cpu"), lambda x: x.float(), train=True,
                         seed=2, rank=1, world_size=2, workers=0,
                         sampler=rank_sampler(train, True, 2, 1, 2))
    assert sum(len(images) for images, _ in loader.batches(epoch=1)) == 56
    # 5 shards of 25 in 4 lanes of 30: this rank reads 2 lanes, 60 samples of 3 shards.
    assert len(opened) == len(set(opened)) <= 3


def test_a_sample_the_writer_wrote_is_read_without_tarfiles_header_parse(shard_folder,
                                                                        monkeypatch):
    """tarfile's parse of a header costs more than a folder's open and read of a file:
    the writer's own headers are checked field by field (hostile ones are parsed whole,
    and refused, above)."""
    train, _, _ = load_shards(str(shard_folder), 8)
    expected = train.encoded(30)

    def parse(*args):
        raise AssertionError("a header was parsed by tarfile")

    monkeypatch.setattr(tarfile.TarInfo, "frombuf", parse)
    fresh, _, _ = load_shards(str(shard_folder), 8)
    assert fresh.encoded(30) == expected and expected[1] == fresh.raw(1, 5)[1]


def test_a_samples_augmentation_seeds_the_cpu_generator_alone_and_puts_it_back(
        shard_folder, monkeypatch):
    """torch.manual_seed also seeds every other device kind: half a millisecond a sample,
    a tenth of decoding and augmenting a photograph."""
    train, _, _ = load_shards(str(shard_folder), 8)
    torch.manual_seed(11)
    expected = train[(40, 9)][0]
    before = torch.get_rng_state()

    def everywhere(seed):
        raise AssertionError("torch.manual_seed was called")

    monkeypatch.setattr(torch, "manual_seed", everywhere)
    assert torch.equal(train[(40, 9)][0], expected)
    assert torch.equal(torch.get_rng_state(), before)
