"""The NVML monitor's arithmetic, against a fake device of known power (the real NVML is in the
GPU tests)."""

import time

import pytest

from cluster.measure.telemetry import Monitor
from cluster.platform._base import Reading
from cluster.platform.nvidia import FakeNvmlSource


class Scripted:
    """Readings at fixed times: 100 W from t=10 s, a power cap event at t=12 s."""

    def __init__(self):
        self.t = 10.0

    def read(self) -> Reading:
        reading = Reading(self.t, (self.t - 10.0) * 100_000.0, 100_000.0, 1980.0, 2619.0, 40.0 + self.t,
                          0x4 if self.t >= 12 else 0)
        self.t += 0.5
        return reading


def test_energy_over_the_marked_region_per_sample():
    monitor = Monitor(Scripted())
    monitor.readings = [monitor.source.read() for _ in range(9)]  # t = 10 .. 14 s
    telemetry = monitor.summary([(11.0, 13.0, 4)], samples=99)
    assert telemetry.energy_j == pytest.approx(200 / 4)  # 100 W over 2 s, 4 timed samples
    assert telemetry.power_w == pytest.approx(100.0) and telemetry.sm_clock_mhz == 1980.0
    assert telemetry.temperature_c == pytest.approx(53.0) and telemetry.throttle_reasons == "sw_power_cap"


def test_energy_over_the_whole_run_without_a_region():
    monitor = Monitor(Scripted())
    monitor.readings = [monitor.source.read() for _ in range(5)]  # t = 10 .. 12 s
    telemetry = monitor.summary([], samples=10)
    assert telemetry.energy_j == pytest.approx(200 / 10)
    assert telemetry.throttle_reasons == "sw_power_cap"


def test_monitor_samples_on_a_thread():
    with Monitor(FakeNvmlSource(power_w=250.0), interval_s=0.005) as monitor:
        time.sleep(0.1)
    assert len(monitor.readings) >= 5
    telemetry = monitor.summary([], samples=1)
    assert telemetry.power_w == pytest.approx(250.0)
    assert telemetry.energy_j == pytest.approx(250.0 * (monitor.readings[-1].t - monitor.readings[0].t), rel=0.05)
