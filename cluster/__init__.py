"""warpfleet's sweep engine: config, toolchains, Ray driver and workers, results, selection."""
