"""Measuring a staged candidate through a ``Runner``: its metric and outputs against the baseline's
(``measure``), against warpfleet's own clock (``clock``), the device's telemetry while it runs
(``telemetry``), the Nsight Compute profile (``profile``), compute-sanitizer's verdicts
(``sanitize``) and the cheat checks (``guardrails``)."""
