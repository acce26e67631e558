"""Bad input gives one line naming the file and the field; good input loads."""

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cluster.cli import main
from cluster.config import LimitsSpec, load_run, load_target
from cluster.core.errors import ConfigError
from cluster.runners.sandbox import Limits
from tests.conftest import write_config, write_target


def test_valid_target_loads_with_defaults(tmp_path):
    target = load_target(write_target(tmp_path))
    assert target.name == "tiny" and target.spec.timeouts.run == 60
    assert target.baseline_params == {"N": 1000}
    assert target.space.name == "cc"
    assert [p for p, _ in target.bundle.files] == ["tiny.c"]
    assert target.space_size() == 2 * 4 * 2 * 2 * 2
    assert target.spec.limits.for_run() == Limits(memory_mb=None, file_mb=1024, disk_mb=4096)


def test_memory_limit_is_for_runs_not_builds():
    limits = LimitsSpec(memory_mb=256, file_mb=8, disk_mb=16)
    assert limits.for_run() == Limits(memory_mb=256, file_mb=8, disk_mb=16)
    assert limits.for_build() == Limits(file_mb=8, disk_mb=16)  # compilers reserve address space freely


def test_source_hash_changes_with_the_source(tmp_path):
    a = load_target(write_target(tmp_path / "a"))
    path = write_target(tmp_path / "b")
    (path.parent / "tiny.c").write_text("int main(void){return 0;}\n")
    assert a.bundle.hash != load_target(path).bundle.hash


BAD_TARGETS = [
    ({"name": 3}, "name", "string"),
    ({"name": "a b"}, "name", "pattern"),
    ({"colour": "red"}, "colour", "unknown field"),
    ({"toolchain": "fortran"}, "toolchain", "unknown toolchain"),
    ({"space": "nope"}, "space", "unknown space"),
    ({"sources": []}, "sources", "at least 1"),
    ({"sources": ["missing.c"]}, "sources[0]", "file not found"),
    ({"sources": ["../tiny.c"]}, "sources[0]", "inside the target"),
    ({"run": "{binary}"}, "run", "list"),
    ({"run": ["{binray}"]}, "run[0]", "unknown placeholder {binray}"),
    ({"build": ["cc", "{flagz}"]}, "build[1]", "unknown placeholder {flagz}"),
    ({"metric": {"regex": "time=("}}, "metric.regex", "regular expression"),
    ({"metric": {"regex": "time=[0-9]+"}}, "metric.regex", "capture group"),
    ({"metric": {"goal": "fastest"}}, "metric.goal", "minimize"),
    ({"verify": {"outputs": ["o"], "rtol": -1}}, "verify.rtol", "greater than or equal"),
    ({"verify": {"outputs": [{"path": "o", "dtype": "float128"}]}}, "verify.outputs[0].dtype", "unknown dtype"),
    ({"timeouts": {"run": 0}}, "timeouts.run", "greater than 0"),
    ({"timeouts": {"run": "soon"}}, "timeouts.run", "number"),
    ({"timeouts": {"run": 1e12}}, "timeouts.run", "less than or equal"),
    ({"params": {"N": []}}, "params", "N has no values"),
    ({"params": {"N": [1, 1]}}, "params", "twice"),
    ({"params": {"1N": [1]}}, "params", "macro name"),
    ({"params": {"N": "big"}}, "params.N", "list"),
    ({"defaults": {"M": 1}}, "defaults.M", "not a param"),
    ({"defaults": {"N": 7}}, "defaults.N", "not one of"),
    ({"constraints": ["N < M"]}, "constraints[0]", "unknown name 'M'"),
    ({"constraints": ["N <"]}, "constraints[0]", "not a valid expression"),
    ({"constraints": ["open('x')"]}, "constraints[0]", "not allowed"),
    ({"constraints": ["N > 5000"]}, "defaults", "violate the constraints"),
    ({"verify": {"test": ["check", "{nothing}"]}}, "verify.test[1]", "unknown placeholder"),
    ({"limits": {"file_mb": 0}}, "limits.file_mb", "greater than or equal"),
    ({"limits": {"memory_mb": 8}}, "limits.memory_mb", "greater than or equal"),
    ({"limits": {"memory_mb": "lots"}}, "limits.memory_mb", "integer"),
    ({"limits": {"disk_mb": 10**9}}, "limits.disk_mb", "less than or equal"),
    ({"limits": {"disk": 64}}, "limits.disk", "unknown field"),
]


@pytest.mark.parametrize(("fields", "field", "message"), BAD_TARGETS,
                         ids=[f"{f}-{m}"[:40] for _, f, m in BAD_TARGETS])
def test_bad_target_names_file_and_field(tmp_path, fields, field, message):
    path = write_target(tmp_path, **fields)
    with pytest.raises(ConfigError) as info:
        load_target(path)
    err = info.value
    assert err.file == str(path) and err.field == field, str(err)
    assert message in err.message, str(err)
    assert "\n" not in str(err)


BAD_RUNS = [
    ({"targets": []}, "targets", "at least 1"),
    ({"targets": ["nope.yaml"]}, "targets[0]", "file not found"),
    ({"search": {"sampler": "annealing"}}, "search.sampler", "tpe"),
    ({"search": {"trials": 0}}, "search.trials", "greater than 0"),
    ({"search": {"trials": 10**12}}, "search.trials", "less than or equal"),
    ({"cluster": {"cpu_workers": 0}}, "cluster.cpu_workers", "greater than or equal"),
    ({"cluster": {"gpu_types": []}}, "cluster.gpu_types", "at least 1"),
    ({"cluster": {"gpu_types": ["H100", "H 200"]}}, "cluster.gpu_types[1]", "pattern"),
    ({"measure": {"final_runs": "many"}}, "measure.final_runs", "integer"),
    ({"profile": {"launches": 0}}, "profile.launches", "greater than or equal"),
    ({"flush_interval": 2}, "flush_interval", "unknown field"),
]


@pytest.mark.parametrize(("fields", "field", "message"), BAD_RUNS, ids=[f for _, f, _ in BAD_RUNS])
def test_bad_run_config_names_file_and_field(tmp_path, fields, field, message):
    write_target(tmp_path / "t")
    path = write_config(tmp_path, ["t/target.yaml"], **fields)
    with pytest.raises(ConfigError) as info:
        load_run(path)
    assert (info.value.file, info.value.field) == (str(path), field), str(info.value)
    assert message in info.value.message


def test_nested_target_error_names_the_target_file(tmp_path):
    write_target(tmp_path / "t", run=[])
    with pytest.raises(ConfigError) as info:
        load_run(write_config(tmp_path, ["t/target.yaml"]))
    assert info.value.file == str(tmp_path / "t" / "target.yaml") and info.value.field == "run"


def test_duplicate_target_names(tmp_path):
    write_target(tmp_path / "a")
    write_target(tmp_path / "b")
    with pytest.raises(ConfigError, match=r"targets\[1\]: a second target named 'tiny'"):
        load_run(write_config(tmp_path, ["a/target.yaml", "b/target.yaml"]))


@pytest.mark.parametrize("text", ["targets: [a", "- just\n- a list\n", ""])
def test_unparseable_yaml(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_run(path)
    assert str(path) in str(info.value)


def test_cli_prints_one_line_and_writes_nothing(tmp_path):
    write_target(tmp_path / "t", timeouts={"run": -1})
    path = write_config(tmp_path, ["t/target.yaml"])
    result = CliRunner().invoke(main, ["sweep", str(path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "target.yaml: timeouts.run:" in lines[0] and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


def test_cli_validate_and_missing_run_dir(tmp_path):
    write_target(tmp_path / "t")
    path = write_config(tmp_path, ["t/target.yaml"])
    ok = CliRunner().invoke(main, ["validate", str(path)])
    assert ok.exit_code == 0 and "tiny: cc, space cc, 64 configurations" in ok.output
    missing = CliRunner().invoke(main, ["show", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "not a warpfleet run directory" in missing.output


def test_every_shipped_config_loads():
    for config in Path(__file__).resolve().parents[3].joinpath("configs").glob("*.yaml"):
        plan = load_run(config)
        assert plan.targets
        assert yaml.safe_load(config.read_text())["targets"]


def test_energy_objective_needs_a_gpu_target(tmp_path):
    write_target(tmp_path / "t")
    path = write_config(tmp_path, ["t/target.yaml"], search={"objective": "energy"})
    with pytest.raises(ConfigError) as info:
        load_run(path)
    assert info.value.field == "search.objective" and "needs GPU workers" in info.value.message


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


CLI_CASES = [("target", *case) for case in BAD_TARGETS] + [("run", *case) for case in BAD_RUNS]


@pytest.mark.parametrize(("bad", "fields", "field", "message"), CLI_CASES,
                         ids=[f"{bad}-{f}-{m}"[:48] for bad, _, f, m in CLI_CASES])
def test_cli_sweep_rejects_bad_input_in_one_line(tmp_path, bad, fields, field, message):
    target = write_target(tmp_path / "t", **(fields if bad == "target" else {}))
    config = write_config(tmp_path, ["t/target.yaml"], **(fields if bad == "run" else {}))
    before = _files(tmp_path)
    result = CliRunner().invoke(main, ["sweep", str(config)])
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith(f"error: {target if bad == 'target' else config}: {field}: "), lines[0]
    assert message in lines[0]
    assert _files(tmp_path) == before and not (tmp_path / "runs").exists()


USAGE_ERRORS = [
    (["sweep", "--bogus", "{config}"], "No such option '--bogus'"),
    (["sweep", "--trials", "0", "{config}"], "'--trials': 0 is not in the range"),
    (["sweep", "{tmp}/missing.yaml"], "missing.yaml: file not found"),
    (["show", "{tmp}"], "not a warpfleet run directory"),
    (["export", "{tmp}"], "not a warpfleet run directory"),
    (["frobnicate"], "No such command 'frobnicate'"),
]


@pytest.mark.parametrize(("args", "message"), USAGE_ERRORS, ids=[" ".join(a[:2]) for a, _ in USAGE_ERRORS])
def test_cli_usage_errors_are_one_error_line(tmp_path, args, message):
    write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"])
    before = _files(tmp_path)
    result = CliRunner().invoke(main, [a.format(config=config, tmp=tmp_path) for a in args])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1 and message in errors[0], result.output
    # click puts its "Usage:" and "Try --help" lines around a usage error; nothing else may appear
    others = [line for line in result.output.splitlines() if line not in errors]
    assert all(line == "" or line.startswith(("Usage: ", "Try ")) for line in others), result.output
    assert _files(tmp_path) == before
