"""Which GPUs a sweep measures on: Ray's accelerator types, all of them or the ones a config names."""

from __future__ import annotations

from cluster.engine.scheduling.workers import gpu_slots

NODES = [
    {"Alive": True, "Resources": {"CPU": 64.0, "GPU": 8.0, "accelerator_type:H100": 1.0}},
    {"Alive": True, "Resources": {"CPU": 64.0, "GPU": 4.0, "accelerator_type:H100": 1.0}},
    {"Alive": True, "Resources": {"CPU": 32.0, "GPU": 2.0, "accelerator_type:A100-80G": 1.0}},
    {"Alive": False, "Resources": {"CPU": 32.0, "GPU": 8.0, "accelerator_type:H200": 1.0}},  # lost
    {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 1.0}},  # a GPU Ray could not name
    {"Alive": True, "Resources": {"CPU": 8.0}},  # the CPU head
]


def test_every_gpu_of_every_alive_node_by_type():
    present, missing = gpu_slots(NODES, None)
    assert present == {"H100": 12, "A100-80G": 2, "": 1} and missing == []


def test_named_types_only_and_the_missing_ones_reported():
    present, missing = gpu_slots(NODES, ["A100-80G", "H200", "B200"])
    assert present == {"A100-80G": 2}
    assert missing == ["H200", "B200"]  # the H200 node is dead: not present


def test_a_named_type_the_cluster_lacks_is_left_out_with_a_reason(ray_local):
    import ray

    from cluster.config import ClusterSpec
    from cluster.engine.scheduling.workers import start_fleet

    workers, devices, left_out = start_fleet(ClusterSpec(gpu_types=["H100"]), {"gpu", "cpu"}, "run.yaml")
    try:
        assert [d.kind for d in devices] == ["cpu"]  # no GPU here: only the CPU worker
        assert left_out == ["GPU type H100: not present in the cluster (present: none)"]
    finally:
        for worker in workers:
            ray.kill(worker)
