"""The performance scorer's factors: the solution's workload against the reference's, timed
at grade time in the same sandbox, interleaved, by the backend from outside (CPU seconds from
the cgroup or rusage, never wall time; the median of `repeats` runs).

A factor is min(1, reference x (1 + tolerance) / solution), never below `floor`: a solution
as fast as the reference, or faster, or slower by less than the tolerance, scores 1; one twice
as slow scores about 0.55 with the default tolerance of 0.1. The reward is the tests' pass
fraction x the speed factor (x the memory factor, on peak MiB, when `memory` is set).
"""

from __future__ import annotations

import statistics

from trialbox.models.performance import PerformanceReport, PerformanceSpec


def factor(reference: float, solution: float, spec: PerformanceSpec) -> float:
    if solution <= 0:
        return 1.0
    return max(spec.floor, min(1.0, reference * (1 + spec.tolerance) / solution))


def cv(values: list[float]) -> float:
    """The coefficient of variation: the noise of one side's runs."""
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if len(values) > 1 and mean > 0 else 0.0


def factors(report: PerformanceReport, spec: PerformanceSpec) -> dict[str, float]:
    """The breakdown: medians, noise and factors (speed, and memory when asked)."""
    if report.policy_failed or not report.policy_cpu_s:
        return {"speed_factor": 0.0}
    ref_cpu = statistics.median(report.reference_cpu_s)
    cpu = statistics.median(report.policy_cpu_s)
    out = {
        "reference_cpu_s": round(ref_cpu, 4),
        "cpu_s": round(cpu, 4),
        "reference_cpu_cv": round(cv(report.reference_cpu_s), 4),
        "cpu_cv": round(cv(report.policy_cpu_s), 4),
        "speed_factor": round(factor(ref_cpu, cpu, spec), 4),
    }
    if spec.memory:
        ref_peak = statistics.median(report.reference_peak_mb)
        peak = statistics.median(report.policy_peak_mb)
        out |= {
            "reference_peak_mb": round(ref_peak, 2),
            "peak_mb": round(peak, 2),
            "memory_factor": round(factor(ref_peak, peak, spec), 4),
        }
    return out
