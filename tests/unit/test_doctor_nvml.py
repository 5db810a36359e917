"""doctor's judgement of NVML readings: a throttled, hot or failing GPU is named with its
rank and host; ranks without readings give one line saying the checks did not run."""

from __future__ import annotations

from workload.doctor import nvml
from workload.doctor.findings import FAIL, INFO, OK, WARN

HOSTS = ["nid001", "nid001", "nid002", "nid002"]


def healthy(**changes) -> dict:
    reading = dict(name="NVIDIA H100", sm_clock_mhz=1980, sm_clock_max_mhz=1980,
                   throttle_bits=0x1, temperature_c=41, slowdown_c=87, ecc_uncorrected=0,
                   retired_pending=0, remap_pending=False)
    return {**reading, **changes}


def test_healthy_gpus_give_one_summary_line():
    found = nvml.nvml_findings([healthy(), healthy(temperature_c=45)], HOSTS)
    assert [(f.status, f.check) for f in found] == [(OK, "gpu-health")]
    assert "2 GPU(s)" in found[0].detail and "41-45 °C" in found[0].detail


def test_a_throttled_gpu_is_named_with_its_rank_host_and_reason():
    # Idle and the software power cap (0x1, 0x4) are routine; HW thermal (0x40) is not.
    found = nvml.nvml_findings([healthy(throttle_bits=0x5),
                                healthy(throttle_bits=0x40, sm_clock_mhz=900)] + [healthy()] * 2,
                               HOSTS)
    warned, = [f for f in found if f.status == WARN]
    assert warned.detail.startswith("rank 1 on nid001 (NVIDIA H100): throttled "
                                    "(HW thermal slowdown): SM clock 900 of 1980 MHz")
    assert "nid001" in warned.fix
    assert "3 GPU(s)" in next(f for f in found if f.status == OK).detail


def test_power_brake_and_hw_slowdown_count_as_throttling():
    assert nvml.throttled_by(0x8 | 0x80) == ["HW slowdown", "HW power brake"]
    assert nvml.throttled_by(0x1 | 0x2 | 0x4 | 0x10) == []


def test_a_gpu_near_its_slowdown_temperature_is_hot():
    found = nvml.nvml_findings([healthy(), healthy(), healthy(temperature_c=84)], HOSTS)
    warned, = [f for f in found if f.status == WARN]
    assert "rank 2 on nid002" in warned.detail and "84 °C, slowdown at 87 °C" in warned.detail
    # No threshold reported (some GPUs): no verdict on temperature.
    assert nvml.gpu_problems(healthy(temperature_c=95, slowdown_c=None)) == ([], [])


def test_uncorrected_ecc_errors_fail_and_pending_retirement_warns():
    found = nvml.nvml_findings([healthy(), healthy(), healthy(),
                                healthy(ecc_uncorrected=3, remap_pending=True)], HOSTS)
    failed, = [f for f in found if f.status == FAIL]
    assert failed.detail.startswith("rank 3 on nid002 (NVIDIA H100): 3 uncorrected ECC")
    assert "reset" in failed.detail and "sbatch --exclude=nid002" in failed.fix
    assert nvml.gpu_problems(healthy(retired_pending=1))[1]
    # ECC off or not reported: None, no verdict.
    assert nvml.gpu_problems(healthy(ecc_uncorrected=None, remap_pending=None)) == ([], [])


def test_ranks_without_nvml_say_once_why_the_checks_did_not_run():
    reason = "this rank runs on the CPU"
    found = nvml.nvml_findings([reason] * 4, HOSTS)
    assert [(f.status, f.detail) for f in found] == [
        (INFO, "NVML checks (clocks, temperature, ECC) did not run: this rank runs on the CPU")]
    assert nvml.read_gpu(__import__("torch").device("cpu")) == reason


def test_the_summary_shows_the_power_draw_beside_the_limit():
    found = nvml.nvml_findings([healthy(power_w=312.4, power_limit_w=700.0),
                                healthy(power_w=655.0, power_limit_w=700.0)], HOSTS)
    assert found[0].detail.endswith("°C, power 312-655 W of a 700 W limit")
    # A GPU or driver without the power queries: the line goes without it.
    assert "power" not in nvml.nvml_findings([healthy(power_w=None)], HOSTS)[0].detail


def test_a_failing_gpus_finding_is_its_ranks_in_the_report():
    """The report says which rank, so which node, a GPU's problem is (diagnose
    --preflight leaves that node out); the lines of the whole job are rank 0's."""
    found = nvml.nvml_findings_by_rank([healthy()] * 2 + [healthy(ecc_uncorrected=2),
                                                          "this rank runs on the CPU"], HOSTS)
    assert [(rank, f.status) for rank, f in found] == [(2, FAIL), (0, OK), (0, INFO)]
