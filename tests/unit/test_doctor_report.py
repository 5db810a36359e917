"""doctor's summary line and overall status from hand-made findings."""

from __future__ import annotations

import io

from workload.doctor.findings import INFO, OK, Finding, print_report, worst


def test_a_healthy_machine_reads_ready(tmp_path):
    # Only ok and info findings (no DALI installed, nothing to warn about): the summary
    # says "ready" and the JSON status is "ok" (info is never the overall status).
    findings = [Finding("dali", INFO, "not installed"), Finding("matmul", OK, "cpu fine"),
                Finding("threads", INFO, "1 thread")]
    assert worst(findings) == OK and worst([]) == OK
    outcome = dict(ranks=[], findings=[(0, f) for f in findings], world_size=1)
    out = io.StringIO()
    print_report(outcome, out)
    assert out.getvalue().splitlines()[-1] == "doctor: ready: 0 failed (-), 0 warnings (-)"
