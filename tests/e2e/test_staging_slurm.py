"""Staging on the private two-node SLURM cluster: four ranks stage a tar'd image folder to
a per-node folder exactly once per node, train from it, and a second run reuses it."""

from __future__ import annotations

import json

import pytest

from tests.helpers import tar_folder, write_image_folder

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SRUN = ["srun", "--kill-on-bad-exit=1", "--time=10", "-N2", "-n4"]


def test_four_ranks_stage_once_per_node_and_reuse_it(slurm_cluster, tmp_path):
    tar = tar_folder(write_image_folder(tmp_path / "pets", per_class=4), tmp_path / "pets.tar")
    local = tmp_path / "local"  # one folder per node: the nodes of this cluster share a disk

    def train(out: str):
        command = (f"exec train --dataset imagefolder --data-dir {tar} "
                   f"--stage-to {local}/$SLURMD_NODENAME --image-size 16 --workers 0 "
                   "--device cpu --model wrn --width 8 --blocks-per-stage 1 --batch-size 2 "
                   f"--epochs 1 --dist-timeout 120 --output-dir {tmp_path / out}")
        done = slurm_cluster.run([*SRUN, "bash", "-c", command], cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout, json.loads((tmp_path / out / "summary.json").read_text())

    out, summary = train("first")
    assert summary["world_size"] == 4 and summary["num_nodes"] == 2
    assert summary["steps_run"] == 1  # 8 images over 4 ranks at batch 2
    staged = [line for line in out.splitlines() if ": staged " in line]
    assert sorted(line.split()[1] for line in staged) == ["nid001:", "nid002:"], out
    nodes = sorted(p.name for p in local.iterdir())
    assert nodes == ["nid001", "nid002"]
    for node in nodes:  # one staging each, verified, nothing half-done left
        [staged] = [p for p in (local / node).iterdir() if p.is_dir()]
        assert sorted(p.name for p in (local / node).iterdir()) == sorted(
            [staged.name, f"{staged.name}.manifest.json", f".{staged.name}.lock"])
        assert staged.name.startswith("pets-")
        assert len(list((staged / "pets" / "train").rglob("*.jpg"))) == 8

    out, _ = train("second")
    reused = [line for line in out.splitlines() if "reusing the staging" in line]
    assert len(reused) == 2 and ": staged " not in out, out
