"""Runs shared by the portability tests (evaluate, compare, report), made once per session."""

from __future__ import annotations

import pytest

from tests.cluster.portability_runs import cpu_runs, gpu_runs


@pytest.fixture(scope="session")
def portability_cpu_runs(tmp_path_factory):
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return cpu_runs(tmp_path_factory.mktemp("portability_cpu"))


@pytest.fixture(scope="session")
def portability_gpu_runs(tmp_path_factory):
    return gpu_runs(tmp_path_factory.mktemp("portability_gpu"))
