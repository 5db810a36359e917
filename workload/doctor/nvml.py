"""`doctor`'s GPU health through NVML (nvidia-ml-py, module `pynvml`): each rank reads
its own GPU (SM clock against its maximum and the throttle reasons that matter,
temperature against the GPU's slowdown threshold, ECC counters) and rank 0 judges them
all, naming the rank and host of a throttled, hot or failing GPU.

Where NVML or a GPU is missing (a CPU rank, CI, no driver, the package not installed) a
rank's reading is the reason, and doctor says once that the checks did not run.
"""

from __future__ import annotations

from workload.doctor.findings import FAIL, INFO, OK, WARN, Finding

# Clock throttle ("event") reason bits of nvml.h that mean the GPU protects itself; the
# others (idle, application clocks, the software power cap, sync boost) are routine.
THROTTLE_REASONS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown",
                    0x40: "HW thermal slowdown", 0x80: "HW power brake"}
HOT_MARGIN_C = 5  # warn this close to the slowdown threshold: the clocks drop there


def read_gpu(device) -> dict | str:
    """This rank's GPU readings, or why there are none (one short reason)."""
    if getattr(device, "type", "cpu") != "cuda":
        return "this rank runs on the CPU"
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py (pynvml) is not installed: pip install nvidia-ml-py"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return f"NVML did not start ({error})"
    from workload.training.energy import gpu_handle  # torch: only where there is a GPU
    try:
        return readings(pynvml, gpu_handle(pynvml, device))
    except pynvml.NVMLError as error:
        return f"NVML could not read the GPU ({error})"
    finally:
        pynvml.nvmlShutdown()


def optional(query, *args):
    """A query some GPUs or drivers do not have (ECC off, no row remapping): None then."""
    import pynvml
    try:
        return query(*args)
    except pynvml.NVMLError:
        return None


def watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def readings(pynvml, handle) -> dict:
    name = pynvml.nvmlDeviceGetName(handle)
    reasons = (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
               or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)
    remapped = optional(pynvml.nvmlDeviceGetRemappedRows, handle)
    return dict(
        name=name.decode() if isinstance(name, bytes) else name,
        sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        sm_clock_max_mhz=pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
        throttle_bits=int(reasons(handle)),
        temperature_c=pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        slowdown_c=optional(pynvml.nvmlDeviceGetTemperatureThreshold, handle,
                            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        ecc_uncorrected=optional(pynvml.nvmlDeviceGetTotalEccErrors, handle,
                                 pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                 pynvml.NVML_VOLATILE_ECC),
        retired_pending=optional(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle),
        remap_pending=None if remapped is None else bool(remapped[2] or remapped[3]),
        power_w=watts(optional(pynvml.nvmlDeviceGetPowerUsage, handle)),
        power_limit_w=watts(optional(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)))


def throttled_by(bits: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if bits & bit]


def gpu_problems(reading: dict) -> tuple[list[str], list[str]]:
    """(failures, warnings) of one GPU's readings, each a phrase with its values."""
    failures = []
    warnings = []
    if reading.get("ecc_uncorrected"):
        failures.append(f"{reading['ecc_uncorrected']} uncorrected ECC errors since the "
                        "driver loaded")
    if reading.get("retired_pending") or reading.get("remap_pending"):
        warnings.append("memory pages or rows wait to be retired, or a row remap failed "
                        "(needs a GPU reset)")
    if reasons := throttled_by(reading["throttle_bits"]):
        warnings.append(f"throttled ({', '.join(reasons)}): SM clock "
                        f"{reading['sm_clock_mhz']} of {reading['sm_clock_max_mhz']} MHz")
    slowdown = reading.get("slowdown_c")
    if slowdown and reading["temperature_c"] >= slowdown - HOT_MARGIN_C:
        warnings.append(f"hot: {reading['temperature_c']} °C, slowdown at {slowdown} °C")
    return failures, warnings


def gpu_finding(rank: int, host: str, reading: dict) -> Finding | None:
    """A failing or warning GPU, named with its rank and host; None for a healthy one."""
    failures, warnings = gpu_problems(reading)
    where = f"rank {rank} on {host} ({reading['name']})"
    if failures:
        return Finding("gpu-health", FAIL, f"{where}: " + "; ".join(failures + warnings),
                       "drain the node and report it to the site (the GPU needs a reset or "
                       f"replacement); meanwhile sbatch --exclude={host}")
    if warnings:
        return Finding("gpu-health", WARN, f"{where}: " + "; ".join(warnings),
                       "check the node's cooling and power (nvidia-smi -q -d "
                       f"PERFORMANCE,TEMPERATURE) or leave it out: sbatch --exclude={host}")
    return None


def nvml_findings(readings_by_rank: list, hosts: list[str]) -> list[Finding]:
    """One finding per GPU with a problem, else one summary line of the healthy ones; one
    line saying why the checks did not run on the ranks without readings."""
    return [finding for _, finding in nvml_findings_by_rank(readings_by_rank, hosts)]


def nvml_findings_by_rank(readings_by_rank: list, hosts: list[str]) -> list[tuple[int, Finding]]:
    """nvml_findings, each with its rank: a GPU's problem its rank's (the report says which
    node to leave out: diagnose --preflight), the lines of the whole job rank 0's."""
    read = [(rank, r) for rank, r in enumerate(readings_by_rank) if isinstance(r, dict)]
    judged = [(rank, r, gpu_finding(rank, hosts[rank], r)) for rank, r in read]
    found = [(rank, finding) for rank, _, finding in judged if finding]
    if good := [r for _, r, finding in judged if finding is None]:
        found.append((0, Finding("gpu-health", OK, summary(good))))
    if reasons := sorted({r for r in readings_by_rank if isinstance(r, str)}):
        found.append((0, Finding("gpu-health", INFO, "NVML checks (clocks, temperature, ECC) "
                                 "did not run: " + "; ".join(reasons))))
    return found


def summary(good: list[dict]) -> str:
    clocks = [r["sm_clock_mhz"] for r in good]
    temps = [r["temperature_c"] for r in good]
    return (f"{len(good)} GPU(s) not throttled, no uncorrected ECC errors; SM clock "
            f"{min(clocks)}-{max(clocks)} of {max(r['sm_clock_max_mhz'] for r in good)} MHz, "
            f"{min(temps)}-{max(temps)} °C{power(good)}")


def power(good: list[dict]) -> str:
    """The boards' power draw beside their enforced limit, where NVML reads both."""
    draws = [r["power_w"] for r in good if r.get("power_w") is not None]
    limits = [r["power_limit_w"] for r in good if r.get("power_limit_w") is not None]
    if not draws or not limits:
        return ""
    return f", power {min(draws):.0f}-{max(draws):.0f} W of a {min(limits):.0f} W limit"
