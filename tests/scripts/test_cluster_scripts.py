"""The cluster recipes in scripts/cluster: the manifests parse with the structure a user relies on,
the shell scripts parse, and they refuse bad arguments in one line before starting anything.
Ray, nvidia-smi and Slurm are stand-ins on PATH that record how they were called."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cluster.config import load_run

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "scripts" / "cluster"
SHELL_SCRIPTS = sorted([*CLUSTER.glob("*.sh"), *CLUSTER.glob("*.sbatch")])

# A stand-in for a command: appends its name, its arguments and RAY_AUTH_MODE to $FAKE_LOG.
FAKE = """#!/usr/bin/env bash
echo "$(basename "$0") $* [RAY_AUTH_MODE=${RAY_AUTH_MODE:-}]" >>"$FAKE_LOG"
"""


def _fake_bin(tmp_path: Path, **bodies: str) -> Path:
    """A folder of stand-in commands (ray, by default) to put first on PATH."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, body in {"ray": "", **bodies}.items():
        path = folder / name
        path.write_text(FAKE + body)
        path.chmod(0o755)
    return folder


def _run(script: str, args: list[str], tmp_path: Path, fakes: Path, **env: str) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    base = {"PATH": f"{fakes}:/usr/bin:/bin", "HOME": str(home), "FAKE_LOG": str(tmp_path / "calls.log")}
    return subprocess.run(["bash", str(CLUSTER / script), *args], capture_output=True, text=True,
                          env={**base, **env}, cwd=REPO, timeout=60, check=False)


def _calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


# -- manifests ---------------------------------------------------------------------------------

def _rayjob_documents() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((CLUSTER / "rayjob.yaml").read_text()) if d]
    return {d["kind"]: d for d in docs}


def test_rayjob_runs_a_sweep_on_gpu_workers():
    docs = _rayjob_documents()
    job = docs["RayJob"]
    assert job["apiVersion"] == "ray.io/v1"
    spec = job["spec"]
    assert "warpfleet sweep" in spec["entrypoint"] and "--address auto" in spec["entrypoint"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert isinstance(yaml.safe_load(spec["runtimeEnvYAML"]), dict)
    cluster = spec["rayClusterSpec"]
    assert cluster["authOptions"]["mode"] == "token"
    head = cluster["headGroupSpec"]
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    head_pod = head["template"]["spec"]
    for container in head_pod["containers"]:
        for kind in ("requests", "limits"):
            assert "nvidia.com/gpu" not in container.get("resources", {}).get(kind, {})
    groups = cluster["workerGroupSpecs"]
    assert groups and all(g["replicas"] >= 1 for g in groups)
    for group in groups:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1


def test_rayjob_config_comes_from_its_configmap_and_names_real_targets(tmp_path):
    docs = _rayjob_documents()
    head_pod = docs["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    volumes = {v["name"]: v for v in head_pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in head_pod["containers"][0]["volumeMounts"]}
    config_volume = next(name for name, v in volumes.items() if "configMap" in v)
    assert volumes[config_volume]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    claim = next(v for v in volumes.values() if "persistentVolumeClaim" in v)["persistentVolumeClaim"]
    assert claim["claimName"] == docs["PersistentVolumeClaim"]["metadata"]["name"]
    # The entrypoint's config is a key of the ConfigMap, where the head mounts it.
    config_path = Path(docs["RayJob"]["spec"]["entrypoint"].split()[2])
    assert str(config_path.parent) == mounts[config_volume]
    text = docs["ConfigMap"]["data"][config_path.name]
    # It loads, once its targets (paths in the image) point at this checkout's configs/.
    local = tmp_path / config_path.name
    local.write_text(text.replace("/opt/warpfleet/", f"{REPO}/"))
    plan = load_run(local)
    assert {t.name for t in plan.targets} == {"saxpy", "stencil_c"}
    assert plan.config.output_dir in mounts.values()


def _ray_cluster_config() -> dict:
    return yaml.safe_load((CLUSTER / "ray-cluster.yaml").read_text())


def test_ray_cluster_yaml_has_gpu_workers_and_a_private_dashboard():
    config = _ray_cluster_config()
    types = config["available_node_types"]
    head_type = config["head_node_type"]
    assert head_type in types and not types[head_type]["resources"].get("GPU")
    workers = {name: t for name, t in types.items() if name != head_type}
    assert any(t["resources"].get("GPU", 0) >= 1 and t.get("min_workers", 0) >= 1 for t in workers.values())
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start and "0.0.0.0" not in head_start
    # Token authentication on every node: the token file is mounted, the mode set in every shell.
    assert any(remote.endswith("/.ray/auth_token") for remote in config["file_mounts"])
    assert any("RAY_AUTH_MODE=token" in c for c in config["initialization_commands"])
    assert any("nvcc" in c for c in config["setup_commands"])


def test_ray_cluster_yaml_matches_rays_schema():
    jsonschema = pytest.importorskip("jsonschema")
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ray is not installed")
    schema = Path(spec.submodule_search_locations[0]) / "autoscaler" / "ray-schema.json"
    jsonschema.validate(_ray_cluster_config(), json.loads(schema.read_text()))


# -- shell scripts -----------------------------------------------------------------------------

def test_all_scripts_are_found():
    assert {p.name for p in SHELL_SCRIPTS} == {"start_head.sh", "start_worker.sh", "slurm_sweep.sbatch"}


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not on PATH")
@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_shellcheck(script):
    result = subprocess.run(["shellcheck", "--shell=bash", str(script)], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(("script", "args"), [
    ("start_head.sh", []),
    ("start_head.sh", ["not-an-ip"]),
    ("start_head.sh", ["10.0.0.300"]),
    ("start_head.sh", ["127.0.0.1"]),
    ("start_head.sh", ["10.0.0.5", "http"]),
    ("start_head.sh", ["10.0.0.5", "80"]),
    ("start_head.sh", ["10.0.0.5", "6379", "extra"]),
    ("start_worker.sh", []),
    ("start_worker.sh", ["head node"]),
    ("start_worker.sh", ["10.0.0.5:port"]),
    ("start_worker.sh", ["10.0.0.5:99999"]),
    ("start_worker.sh", ["10.0.0.5:6379", "extra"]),
    ("start_worker.sh", ["--address=10.0.0.5:6379"]),
])
def test_bad_arguments_fail_in_one_line_before_ray(tmp_path, script, args):
    result = _run(script, args, tmp_path, _fake_bin(tmp_path, **{"nvidia-smi": "echo 0"}))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"usage: {script}" in lines[0], result.stderr
    assert _calls(tmp_path) == []


@pytest.mark.parametrize("script", ["start_head.sh", "start_worker.sh"])
def test_help_prints_usage_and_starts_nothing(tmp_path, script):
    result = _run(script, ["--help"], tmp_path, _fake_bin(tmp_path))
    assert result.returncode == 0 and result.stdout.startswith(f"usage: {script}")
    assert _calls(tmp_path) == []


def test_start_head_turns_on_token_auth_and_keeps_the_dashboard_local(tmp_path):
    result = _run("start_head.sh", ["10.0.0.5"], tmp_path, _fake_bin(tmp_path))
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path) == [
        "ray get-auth-token --generate [RAY_AUTH_MODE=token]",
        "ray start --head --node-ip-address=10.0.0.5 --port=6379 --dashboard-host=127.0.0.1 [RAY_AUTH_MODE=token]",
    ]
    assert "start_worker.sh 10.0.0.5:6379" in result.stdout


def test_start_head_uses_a_given_token_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("secret")
    result = _run("start_head.sh", ["10.0.0.5", "7000"], tmp_path, _fake_bin(tmp_path),
                  RAY_AUTH_TOKEN_PATH=str(token))
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path) == [
        "ray start --head --node-ip-address=10.0.0.5 --port=7000 --dashboard-host=127.0.0.1 [RAY_AUTH_MODE=token]",
    ]


def _with_token(tmp_path: Path) -> None:
    token = tmp_path / "home" / ".ray" / "auth_token"
    token.parent.mkdir(parents=True)
    token.write_text("secret")


def test_start_worker_joins_with_the_gpus_nvidia_smi_lists(tmp_path):
    _with_token(tmp_path)
    fakes = _fake_bin(tmp_path, **{"nvidia-smi": "printf '0\\n1\\n2\\n3\\n'"})
    result = _run("start_worker.sh", ["10.0.0.5"], tmp_path, fakes)
    assert result.returncode == 0, result.stderr
    calls = _calls(tmp_path)
    assert calls[-1] == "ray start --address=10.0.0.5:6379 --num-gpus=4 [RAY_AUTH_MODE=token]"
    assert "nvcc" in result.stderr  # warned: no nvcc among the stand-ins


def test_start_worker_counts_cuda_visible_devices(tmp_path):
    _with_token(tmp_path)
    result = _run("start_worker.sh", ["head.internal:7000"], tmp_path, _fake_bin(tmp_path),
                  CUDA_VISIBLE_DEVICES="1,3")
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path) == ["ray start --address=head.internal:7000 --num-gpus=2 [RAY_AUTH_MODE=token]"]


def test_start_worker_without_a_token_starts_nothing(tmp_path):
    result = _run("start_worker.sh", ["10.0.0.5:6379"], tmp_path, _fake_bin(tmp_path, **{"nvidia-smi": "echo 0"}))
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1 and "auth token" in result.stderr
    assert _calls(tmp_path) == []


# -- the Slurm script, against stand-ins for Slurm and Ray --------------------------------------

SLURM_FAKES = {
    # srun: log, drop the options, run the command (in place: `kill` of its pid reaches it).
    "srun": 'while [[ $1 == -* ]]; do shift; done; exec "$@"',
    "ray": 'if [[ " $* " == *" --block "* ]]; then exec sleep 30; fi',
    "hostname": 'echo "10.1.0.1 fe80::1"',
    "python3": "cat >/dev/null",  # the wait for the nodes: Ray is a stand-in here
    "warpfleet": 'echo "token file: ${RAY_AUTH_TOKEN_PATH:-}" >>"$FAKE_LOG"; exit 3',
}


def _slurm_env() -> dict[str, str]:
    return {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2", "SLURMD_NODENAME": "node1",
            "SLURM_GPUS_PER_NODE": "h100:8", "SLURM_CPUS_PER_TASK": "16"}


def test_slurm_script_starts_ray_runs_the_sweep_and_stops_ray(tmp_path):
    fakes = _fake_bin(tmp_path, **SLURM_FAKES)
    result = _run("slurm_sweep.sbatch", ["configs/demo.yaml", "--trials", "4"], tmp_path, fakes,
                  **_slurm_env())
    assert result.returncode == 3, result.stderr  # warpfleet's exit status
    calls = _calls(tmp_path)
    head = next(c for c in calls if c.startswith("ray start --head"))
    assert "--node-ip-address=10.1.0.1 --port=6379 --dashboard-host=127.0.0.1" in head
    assert "--num-cpus=16 --num-gpus=8 --block [RAY_AUTH_MODE=token]" in head
    head_step = next(c for c in calls if c.startswith("srun") and "--head" in c)
    assert "--cpus-per-task=16 --gpus-per-node=8 --nodelist=node1 ray start" in head_step
    assert any(c.startswith("srun") and "--exclude=node1" in c and "--gpus-per-node=8" in c for c in calls)
    assert "ray start --address=10.1.0.1:6379 --num-cpus=16 --num-gpus=8 --block [RAY_AUTH_MODE=token]" in calls
    sweep = next(c for c in calls if c.startswith("warpfleet"))
    assert sweep.startswith("warpfleet sweep configs/demo.yaml --address 10.1.0.1:6379")
    assert sweep.endswith("--trials 4 [RAY_AUTH_MODE=token]")
    assert calls.index(sweep) < calls.index("ray stop [RAY_AUTH_MODE=token]")
    token_file = Path(next(c for c in calls if c.startswith("token file: ")).split(": ", 1)[1])
    assert token_file.parent == tmp_path / "home" / ".ray" and not token_file.exists()


@pytest.mark.parametrize(("args", "env", "message"), [
    ([], {}, "missing CONFIG"),
    (["configs/nope.yaml"], {}, "is not a file"),
    (["configs/demo.yaml"], {"SLURM_JOB_ID": ""}, "not inside a Slurm job"),
    (["configs/demo.yaml"], {"SLURM_GPUS_PER_NODE": "h100:many"}, "GPU count"),
])
def test_slurm_script_refuses_bad_input_before_starting_ray(tmp_path, args, env, message):
    fakes = _fake_bin(tmp_path, **SLURM_FAKES)
    result = _run("slurm_sweep.sbatch", args, tmp_path, fakes, **{**_slurm_env(), **env})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "usage: sbatch" in lines[0], result.stderr
    assert not any(c.startswith(("ray", "srun")) for c in _calls(tmp_path))
