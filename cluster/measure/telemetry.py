"""Device telemetry while a candidate runs: the platform's readings (``Platform.telemetry``: NVML on
NVIDIA's) sampled on a thread, summarised per measurement (energy over the timed region, power,
clocks, temperature, clock event reasons).

Clocks, power limits and modes are only ever read. A ``FakeNvmlSource`` (cluster.platform.nvidia)
stands in for machines without a GPU (CI); the real ``NvmlSource`` is exercised by the GPU tests.
"""

from __future__ import annotations

import bisect
import statistics
import threading
from types import TracebackType

from cluster.core.types import Telemetry
from cluster.platform._base import CLOCK_EVENT_REASONS, Reading, ReadingSource


class Monitor:
    """Samples a source every ``interval_s`` while entered; ``summary`` condenses the readings."""

    def __init__(self, source: ReadingSource, interval_s: float = 0.01) -> None:
        self.source, self.interval_s = source, interval_s
        self.readings: list[Reading] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Monitor:
        self.readings, self._stop = [self.source.read()], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.readings.append(self.source.read())

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.readings.append(self.source.read())

    def summary(self, regions: list[tuple[float, float, int]], samples: int) -> Telemetry:
        """Energy per timed sample: over the harness's marked regions when there are any, else over
        everything sampled, divided by the number of metric samples."""
        readings = sorted(self.readings + ([self.source.read()] if self._thread and self._thread.is_alive()
                                           else []), key=lambda r: r.t)
        windows = [(start, end) for start, end, _ in regions] or [(readings[0].t, readings[-1].t)]
        counted = sum(n for _, _, n in regions) or samples
        energy = [self._energy(readings, start, end) for start, end in windows]
        inside = [r for r in readings if any(start <= r.t <= end for start, end in windows)] or readings
        reasons = 0
        for r in inside:
            reasons |= r.reasons
        return Telemetry(
            energy_j=sum(energy) / counted / 1000 if counted and None not in energy else None,  # type: ignore[operator]
            power_w=_mean([r.power_mw / 1000 for r in inside if r.power_mw is not None]),
            sm_clock_mhz=_median([r.sm_clock_mhz for r in inside if r.sm_clock_mhz is not None]),
            mem_clock_mhz=_median([r.mem_clock_mhz for r in inside if r.mem_clock_mhz is not None]),
            temperature_c=max((r.temperature_c for r in inside if r.temperature_c is not None), default=None),
            throttle_reasons=",".join(name for bit, name in CLOCK_EVENT_REASONS.items() if reasons & bit),
            readings=len(inside),
        )

    @staticmethod
    def _energy(readings: list[Reading], start: float, end: float) -> float | None:
        """Energy counter difference over [start, end] in mJ, linearly interpolated."""
        points = [(r.t, r.energy_mj) for r in readings if r.energy_mj is not None]
        if len(points) < 2:
            return None
        times = [t for t, _ in points]

        def at(t: float) -> float:
            i = min(max(bisect.bisect_left(times, t), 1), len(points) - 1)
            (t0, e0), (t1, e1) = points[i - 1], points[i]
            return e0 if t1 == t0 else e0 + (e1 - e0) * (t - t0) / (t1 - t0)

        return max(0.0, at(end) - at(start))


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
