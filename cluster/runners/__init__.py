"""Running one candidate: build it (the Builder half), then stage, run and check it through a
``Runner`` (the Runner half: a subprocess per run, or a persistent process per device), inside the
sandbox; its measurement, telemetry, Nsight Compute profile, compute-sanitizer verdicts and cheat
checks; and the timing harness that targets include (include/warpfleet)."""
