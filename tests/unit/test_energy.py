"""The energy counters one by one: a counter that goes backwards or stops answering is
said once and never raises, RAPL's wrap is carried over, a checkpoint's record is checked,
and a missing figure is null with its reason, never 0 (the runs: tests/e2e/test_energy.py)."""

from __future__ import annotations

import logging
import math
import time

import pytest
import torch

from workload.training import energy


def scripted(values):
    """A counter that returns `values` in turn (joules); an exception instance is raised."""
    values = iter(values)

    def read():
        value = next(values)
        if isinstance(value, Exception):
            raise value
        return value
    return read


def test_a_counter_adds_its_differences(caplog):
    meter = energy.Meter("c", scripted([100.0, 110.0, 125.5]))
    assert meter.update() == 10.0 and meter.update() == 25.5 and meter.total() == 25.5
    assert not caplog.records


def test_a_counter_that_goes_backwards_counts_on_from_its_new_value_said_once(caplog):
    meter = energy.Meter("c", scripted([100.0, 110.0, 4.0, 9.0, 2.0]))
    with caplog.at_level(logging.WARNING, logger="workload"):
        totals = [meter.update() for _ in range(4)]
    assert totals == [10.0, 14.0, 19.0, 21.0]
    assert sum("went backwards" in r.getMessage() for r in caplog.records) == 1


def test_a_counter_that_stops_answering_ends_its_count_once_and_never_raises(caplog):
    meter = energy.Meter("c", scripted([100.0, 110.0, OSError("gone"), 130.0]))
    with caplog.at_level(logging.WARNING, logger="workload"):
        assert meter.update() == 10.0
        assert meter.update() is None and meter.update() is None
    assert math.isnan(meter.total()) and meter.reason == "c stopped answering (gone)"
    assert sum("stopped answering" in r.getMessage() for r in caplog.records) == 1


def test_a_counter_unreadable_from_the_start_is_a_reason_not_a_zero():
    meter = energy.Meter("c", scripted([RuntimeError("Not Supported")]))
    assert meter.reason == "c cannot be read (Not Supported)" and math.isnan(meter.total())


def test_a_cpu_rank_reads_no_gpu_even_told_to_read_a_stand_in(monkeypatch):
    # The real pynvml (a dependency): the variable alone never makes a CPU rank read a
    # GPU of the node; only a module that says it is a stand-in does.
    monkeypatch.setenv(energy.STAND_IN_VARIABLE, "1")
    assert energy.gpu_meter(torch.device("cpu"), 0).reason == "the ranks run on the CPU"


def write_zone(root, name, zone, energy_uj, max_uj=1000_000):
    folder = root / name
    folder.mkdir(exist_ok=True)
    (folder / "name").write_text(zone + "\n")
    (folder / "energy_uj").write_text(f"{energy_uj}\n")
    (folder / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return folder


def test_rapl_reads_the_packages_once_each_across_their_wrap(tmp_path):
    p0 = write_zone(tmp_path, "intel-rapl:0", "package-0", 900_000)
    write_zone(tmp_path, "intel-rapl:1", "package-1", 10)
    write_zone(tmp_path, "intel-rapl:0:0", "dram", 5)  # inside package 0: not again
    write_zone(tmp_path, "intel-rapl:2", "psys", 5)  # the platform: covers the packages
    assert [z.name for z in energy.package_zones(tmp_path)] == ["intel-rapl:0", "intel-rapl:1"]
    meter = energy.cpu_meter(0, tmp_path)
    (p0 / "energy_uj").write_text("100000\n")  # wrapped at 1 J: 0.2 J later
    assert meter.update() == 0.2
    assert energy.cpu_meter(1, tmp_path).update() == 0.0  # the node counts once
    assert energy.cpu_meter(0, tmp_path / "none").reason.startswith("no RAPL package zones")


@pytest.mark.parametrize("file, holds", [("energy_uj", "garbage"), ("energy_uj", "-5"),
                                         ("max_energy_range_uj", "12ab"),
                                         ("max_energy_range_uj", "0"),
                                         ("energy_uj", "9" * 5000)],
                         ids=["garbage", "negative", "range-garbage", "range-0", "5000-digits"])
def test_a_rapl_counter_that_is_no_number_is_one_line_and_no_figure(tmp_path, caplog, file,
                                                                    holds):
    zone = write_zone(tmp_path, "intel-rapl:0", "package-0", 900_000)
    (zone / file).write_text(holds + "\n")
    with caplog.at_level(logging.WARNING, logger="workload"):
        meter = energy.cpu_meter(0, tmp_path)
    assert meter.reason.startswith(f"RAPL cannot be read ({zone / file} holds ")
    assert math.isnan(meter.total()) and meter.update() is None
    said, = [r.getMessage() for r in caplog.records]
    assert "energy: the node's CPU package energy (RAPL) is not counted: " in said
    assert str(zone / file) in said and "\n" not in said and len(said) < 300


def test_a_checkpoint_without_a_readable_record_leaves_the_total_unknown():
    account = energy.EnergyAccount(energy.Meter("g", scripted([1.0] * 9)),
                                   energy.Meter("c", scripted([1.0] * 9)),
                                   torch.device("cpu"), 1)
    account.load_state_dict({"gpu_j": "12"})
    record = account.gather_across_ranks()
    assert record["gpu_j"] is None and record["gpu_source"].startswith("unavailable: ")


def test_the_probe_is_given_at_construction_and_state_dict_is_no_collective(monkeypatch):
    """Issue 63: the loop's probe (the images the per-image energy divides by) is an
    argument of the account, never set on it from outside; the totals across ranks are
    the named collective gather_across_ranks, and state_dict reads what it found."""
    from workload import distributed
    from workload.training.probe import StepProbe

    probe = StepProbe()
    account = energy.EnergyAccount(energy.Meter("g", scripted([1.0, 3.0, 6.0])),
                                   energy.Meter("c", scripted([2.0] * 9)),
                                   torch.device("cpu"), 1, probe)
    probe.images = 40
    gathered = account.gather_across_ranks()
    assert gathered["images"] == 40 and gathered["gpu_j"] == 2.0 and gathered["jobs"] == 1

    def no_collective(*_args):
        raise AssertionError("state_dict made a collective")
    monkeypatch.setattr(distributed, "all_gather_floats", no_collective)
    monkeypatch.setattr(distributed, "gather_objects", no_collective)
    probe.images = 80  # counted by the next gather, not by state_dict
    assert account.state_dict() == gathered


def test_the_summary_is_null_with_its_reason_never_zero():
    record = dict(gpu_j=None, gpu_source="unavailable: the ranks run on the CPU",
                  cpu_package_j=7.2e6, cpu_package_source=energy.CPU_SOURCE, images=10, jobs=3)
    fields = energy.summary_fields(record, steps=5)
    assert fields["gpu_energy_j"] is None and fields["gpu_energy_kwh"] is None
    assert fields["gpu_energy_per_image_j"] is None and fields["gpu_energy_per_step_j"] is None
    assert fields["cpu_package_energy_kwh"] == 2.0 and fields["energy_jobs"] == 3


def test_one_source_per_reason_with_its_ranks():
    reasons = [{"gpu": "lost"}, {"gpu": None}, {"gpu": "lost"}, {"gpu": "old"}]
    said = energy.EnergyAccount._source("gpu", energy.GPU_SOURCE, reasons)
    assert said == "unavailable: rank 0 and 1 more: lost; rank 3: old"
    every = energy.EnergyAccount._source("gpu", energy.GPU_SOURCE, [{"gpu": "cpu"}] * 2)
    assert every == "unavailable: cpu"
    # An earlier job's reason is carried on as it was, however many jobs follow.
    later = energy.EnergyAccount._source("gpu", every, [{"gpu": None}])
    assert later == "unavailable: not counted in an earlier job of this run (cpu)"
    assert energy.EnergyAccount._source("gpu", later, [{"gpu": None}]) == later


def test_the_pages_comparison_with_sacct_cites_slurms_manual():
    from tests.helpers import REPO
    page = " ".join((REPO / "docs" / "energy.md").read_text().split())
    # sacct(1), ConsumedEnergy (doc/man/man1/sacct.1 of SchedMD/slurm at 284c3b95).
    assert ('"Total energy consumed by all tasks in a job, in joules"' in page)
    assert ("only in the case of an exclusive job allocation does this value reflect the "
            "job's real energy consumption\" (https://slurm.schedmd.com/sacct.html, read "
            "2026-11-26" in page)


def test_the_first_interval_starts_with_the_training_and_its_power_is_the_counters():
    """The GPU counter is read in the background (workload/training/background_read.py):
    an interval's watts come from its readings' own times, an interval reports the one
    before it, and the energy spent before the training (the start-up) is in none."""
    from workload.training.background_read import BackgroundReader

    watts = 250.0

    def board():  # a board drawing `watts`, whose counter takes 50 ms to answer
        time.sleep(0.05)
        return watts * time.perf_counter()
    account = energy.EnergyAccount(energy.Meter("g", BackgroundReader(board, "g")),
                                   energy.Meter("c", scripted([1.0] * 9)),
                                   torch.device("cpu"), 1)
    time.sleep(0.5)  # the start-up, at full power
    account.start()
    time.sleep(0.3)
    first = account.numbers()  # no reading newer than the start yet: it starts one
    assert math.isnan(first[0]) and math.isnan(first[1]) and first[4] > 0
    time.sleep(0.3)
    joules, power = account.numbers()[:2]  # from the start to the reading it started
    assert power == pytest.approx(watts, rel=0.05)
    assert watts * 0.3 < joules < watts * 0.3 * 1.3  # not the start-up's 125 J besides
