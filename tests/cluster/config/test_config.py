"""Bad input gives one line naming the file and the field; good input loads."""

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cluster.cli import main
from cluster.config import LimitsSpec, load_run, load_target
from cluster.core.errors import ConfigError
from cluster.sandbox.sandbox import Limits
from tests.conftest import write_config, write_target


def test_valid_target_loads_with_defaults(tmp_path):
    target = load_target(write_target(tmp_path))
    assert target.name == "tiny" and target.spec.timeouts.run == 60
    assert target.baseline_params == {"N": 1000}
    assert target.space.name == "cc"
    assert [p for p, _ in target.bundle.files] == ["tiny.c"]
    assert target.space_size() == 2 * 3 * 2 * 2 * 2
    assert target.baseline_flags["opt_level"] == "-O2"  # what a release build has, not -O0
    assert target.spec.limits.for_run() == Limits(memory_mb=None, file_mb=1024, disk_mb=4096, files=20_000)


def test_memory_limit_is_for_runs_not_builds():
    limits = LimitsSpec(memory_mb=256, file_mb=8, disk_mb=16)
    assert limits.for_run() == Limits(memory_mb=256, file_mb=8, disk_mb=16, files=20_000)
    assert limits.for_build() == Limits(file_mb=8, disk_mb=16, files=20_000)  # compilers reserve address space freely


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
    # issue 17
    ({"name": "."}, "name", "pattern"),
    ({"name": ".."}, "name", "pattern"),
    ({"name": "-rf"}, "name", "pattern"),
    ({"name": "x" * 101}, "name", "pattern"),
    ({"params": {"N": [True, False]}}, "params", "N: True is not a number or a string"),
    ({"params": {"N": list(range(10_001))}}, "params", "N has 10001 values (at most 10000)"),
    ({"params": {f"P{i}": [1] for i in range(65)}}, "params", "at most 64"),
    ({"constraints": ["N / 0 > 1"]}, "constraints[0]", "division by zero"),
    ({"constraints": ["N / (N - 1000) > 1"]}, "constraints[0]", "division by zero"),
    ({"constraints": ["9 ** 9 ** 9 > 0"]}, "constraints[0]", "a power past 4096 bits"),
    ({"constraints": ["N ** N ** N > 0"]}, "constraints[0]", "a power past 4096 bits"),
    ({"constraints": ["'a' * 10**10 == 'a'"]}, "constraints[0]", "a string longer than"),
    ({"constraints": ["'%0999999999d' % N == 'x'"]}, "constraints[0]", "not defined on strings"),
    ({"constraints": ["N>0" + " or N>0" * 70]}, "constraints[0]", "more than 200 terms"),
    ({"constraints": ["N > 0" + " and N > 0" * 100]}, "constraints[0]", "longer than 1000 characters"),
    ({"baseline_flags": {"opt": "-O3"}}, "baseline_flags.opt", "not a flag of space cc"),
    ({"baseline_flags": {"opt_level": "-O9"}}, "baseline_flags.opt_level", "'-O9' is not one of its options"),
    ({"baseline_flags": {"opt_level": 3}}, "baseline_flags.opt_level", "string"),
    # issue 27: a value the Parquet writer would lose every row over, and what YAML reads as a float
    ({"params": {"N": [1000, 2**64]}}, "params", "N: 18446744073709551616 does not fit in 64 bits"),
    ({"params": {"N": [1000, -(2**63) - 1]}}, "params", "does not fit in 64 bits"),
    ({"params": {"N": [1000, float("inf")]}}, "params", "N: inf is not a finite number"),
    ({"params": {"N": [1000, float("nan")]}}, "params", "N: nan is not a finite number"),
    ({"params": {"seed": [1, 2]}}, "params", "seed is the name of a placeholder ({seed})"),
    ({"params": {"binary": [1, 2]}}, "params", "binary is the name of a placeholder ({binary})"),
    ({"params": {"flags": [1, 2]}}, "params", "flags is the name of a placeholder"),
    ({"timeouts": {"rn": 5}}, "timeouts.rn", "unknown field (did you mean run?)"),
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
    ({"measure": {"race": 1.0}}, "measure.race", "greater than 1"),  # 1: every candidate slower than the best
    ({"profile": {"launches": 0}}, "profile.launches", "greater than or equal"),
    ({"flush_interval": 2}, "flush_interval", "unknown field"),
    # issue 17
    ({"search": {"trials": True}}, "search.trials", "integer"),
    ({"search": {"trials": 2.0}}, "search.trials", "integer"),
    ({"measure": {"final_runs": "5"}}, "measure.final_runs", "integer"),
    ({"name": ".."}, "name", "pattern"),
    ({"name": "a/b"}, "name", "pattern"),
    # issue 27
    ({"search": {"time_budget_s": float("inf")}}, "search.time_budget_s", "finite number"),
    ({"search": {"time_budget_s": float("nan")}}, "search.time_budget_s", "finite number"),
    ({"search": {"storage": "notaurl"}}, "search.storage", "not a database URL"),
    ({"search": {"storage": "sqlite:////nonexistent/x.db"}}, "search.storage",
     "the folder of /nonexistent/x.db does not exist"),
    ({"search": {"storage": "mysql+nodriver://h/db"}}, "search.storage", "driver is not installed"),
    ({"serach": {"trials": 3}}, "serach", "unknown field (did you mean search?)"),
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


def test_a_misspelt_top_level_key_is_an_unknown_field_not_a_missing_one(tmp_path):
    """Seen: `tagets:` said `targets: Field required`, where a nested misspelling said unknown field."""
    path = tmp_path / "run.yaml"
    path.write_text("name: t\ntagets: [t/target.yaml]\n")
    with pytest.raises(ConfigError) as info:
        load_run(path)
    assert (info.value.field, info.value.message) == ("tagets", "unknown field (did you mean targets?)")


def test_a_key_given_twice_is_refused_naming_it(tmp_path):
    """Seen: `trials: 8` and later `trials: 800` in one mapping: the last won, unseen."""
    write_target(tmp_path / "t")
    path = tmp_path / "run.yaml"
    path.write_text("name: t\ntargets: [t/target.yaml]\nsearch:\n  trials: 8\n  seed: 1\n  trials: 800\n")
    before = _files(tmp_path)
    result = CliRunner().invoke(main, ["sweep", str(path)])
    assert result.exit_code == 2 and result.output.splitlines() == [
        f"error: {path}: line 6: not valid YAML (the key 'trials' is given twice)"]
    assert _files(tmp_path) == before
    path.write_text("name: t\nbase: &b {trials: 3}\ntargets: [t/target.yaml]\nsearch:\n  <<: {trials: 3}\n"
                    "  trials: 4\n")  # a merge key's value may be overridden, as YAML means it to be
    with pytest.raises(ConfigError, match="base: unknown field"):
        load_run(path)


def test_a_target_file_given_for_a_config_and_back_says_which_it_is(tmp_path):
    target = write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"])
    as_config = CliRunner().invoke(main, ["validate", str(target)])
    assert as_config.exit_code == 2 and as_config.output.splitlines() == [
        f"error: {target}: a target file, not a run config: list it under a run config's targets: "
        "(warpfleet optimize takes a target file)"]
    as_target = CliRunner().invoke(main, ["optimize", str(config), "--output-dir", str(tmp_path / "out")])
    assert as_target.exit_code == 2 and as_target.output.splitlines() == [
        f"error: {config}: a run config, not a target file: warpfleet sweep and validate take it"]
    assert not (tmp_path / "out").exists()


def test_an_output_dir_that_cannot_hold_a_run_is_one_line_against_what_named_it(tmp_path, monkeypatch):
    """Seen: `validate` passed an unwritable output_dir, and `sweep --output-dir` blamed the config
    file, after Ray had started."""
    import cluster.cli

    monkeypatch.setattr(cluster.cli, "_join_ray", lambda *a: pytest.fail("Ray joined before the check"))
    write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"], output_dir=str(tmp_path / "t" / "tiny.c" / "runs"))
    before = _files(tmp_path)
    problem = f"cannot create a run directory there (Not a directory: {tmp_path / 't' / 'tiny.c'})"
    for command in ("validate", "sweep"):
        result = CliRunner().invoke(main, [command, str(config)])
        assert result.exit_code == 2 and result.output.splitlines() == [
            f"error: {config}: output_dir: {tmp_path / 't' / 'tiny.c' / 'runs'}: {problem}"], result.output
    config = write_config(tmp_path, ["t/target.yaml"])
    before = _files(tmp_path)
    given = str(tmp_path / "t" / "tiny.c" / "runs")
    result = CliRunner().invoke(main, ["sweep", str(config), "--output-dir", given])
    assert result.exit_code == 2 and result.output.splitlines() == [f"error: {given}: --output-dir: {problem}"]
    assert _files(tmp_path) == before


@pytest.mark.parametrize("budget", ["nan", "inf", "-inf"])
def test_a_time_budget_must_be_a_finite_number(tmp_path, budget):
    write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"])
    before = _files(tmp_path)
    result = CliRunner().invoke(main, ["sweep", str(config), "--time-budget", budget])
    assert result.exit_code == 2 and "'--time-budget'" in result.output and "Traceback" not in result.output
    assert _files(tmp_path) == before


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
    assert ok.exit_code == 0 and "tiny: cc, space cc, 48 configurations" in ok.output
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


# -- issue 17: configs that took minutes, memory or silence --------------------------------------
def _one_line(result, *words: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output and all(w in lines[0] for w in words), lines
    return lines[0]


def test_a_config_file_of_megabytes_is_refused_at_once(tmp_path, monkeypatch):
    """Seen: 50 MB of YAML read for 17 s, a list of 20 million ints killed for its memory. Refused
    by its size, before any YAML is parsed (the parser is what took the time)."""
    import yaml

    write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"])
    config.write_text(config.read_text() + "padding: [" + "1," * 3_000_000 + "1]\n")

    def parse(*args, **kwargs):
        raise AssertionError("a file past the size limit was parsed")

    monkeypatch.setattr(yaml, "load", parse)  # safe_load and every loader go through it
    _one_line(CliRunner().invoke(main, ["validate", str(config)]), f"error: {config}: ", "larger than 4 MB")


@pytest.mark.timeout(120)  # a guard against the hang (it was 82 s, or never), not a speed target
def test_big_spaces_are_counted_without_enumerating_them(tmp_path):
    """Seen: a param of 10^6 values validated in 82 s, three of 1000 values never finished."""
    huge = write_target(tmp_path / "huge")
    # Three times the cap is enough to be refused by its count (300,000 took 10 s of YAML parsing here).
    huge.write_text(huge.read_text().replace("N:\n  - 1000\n  - 2000", "N: " + str(list(range(30_000)))))
    with pytest.raises(ConfigError, match="N has 30000 values"):
        load_target(huge)
    write_target(tmp_path / "t", params={name: list(range(1000)) for name in ("A", "B", "N")},
                 constraints=["A * B < N"], defaults={"N": 999})
    config = write_config(tmp_path, ["t/target.yaml"])
    result = CliRunner().invoke(main, ["validate", str(config)])
    assert result.exit_code == 0, result.output
    assert "at most 24000000000 configurations (too many to count with the constraints)" in result.output
    small = load_target(write_target(tmp_path / "s", params={"N": [1, 2, 3, 4]}, constraints=["N % 2 == 1"]))
    assert small.space_count() == (24 * 2, True) and small.space_size() == 48


def test_a_baseline_of_the_users_build_and_a_header_among_the_sources(tmp_path):
    """baseline_flags picks the baseline's option of a flag; a header in sources is a source (agents
    may edit it) that the build does not compile on its own."""
    folder = tmp_path / "t"
    write_target(folder, sources=["tiny.c", "tiny.h"], baseline_flags={"opt_level": "-O3"})
    (folder / "tiny.h").write_text("#define SCALE 2\n")
    (folder / "tiny.c").write_text('#include "tiny.h"\n' + (folder / "tiny.c").read_text())
    target = load_target(folder / "target.yaml")
    assert target.baseline_flags["opt_level"] == "-O3" and target.space.flags["opt_level"][0] == "-O3"
    assert set(target.space.flags["opt_level"]) == {"-O1", "-O2", "-O3"}
    assert target.compiled_sources == ["tiny.c"]
    config = write_config(tmp_path, ["t/target.yaml"])
    result = CliRunner().invoke(main, ["validate", str(config), "--build"])
    assert result.exit_code == 0, result.output
    assert "tiny: the baseline builds (host)" in result.output and "tiny: N: changes the binary" in result.output
    write_target(tmp_path / "h", sources=["tiny.h"])
    (tmp_path / "h" / "tiny.h").write_text("")
    with pytest.raises(ConfigError, match="sources: only headers"):
        load_target(tmp_path / "h" / "target.yaml")


def test_validate_build_warns_about_a_param_the_source_ignores(tmp_path):
    """A macro defined without #ifndef: the -D is overridden and the search measures one program."""
    folder = tmp_path / "t"
    write_target(folder, params={"N": [1000, 2000], "M": [1, 2]})
    source = (folder / "tiny.c").read_text()
    (folder / "tiny.c").write_text(source.replace("#ifndef N\n#define N 1000\n#endif", "#undef N\n#define N 1000"))
    result = CliRunner().invoke(main, ["validate", str(write_config(tmp_path, ["t/target.yaml"])), "--build"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if "warning" in line]
    assert len(warnings) == 2, result.output
    assert any("param N does not change the binary" in w and "#ifndef N" in w for w in warnings)
    assert any("param M does not change the binary" in w for w in warnings)


def test_validate_build_shows_the_compilers_error_line_for_a_value_that_does_not_build(tmp_path):
    """Seen: `compile_error:  |  ^~`, the caret under the quoted source line, and nothing else."""
    write_target(tmp_path / "t", params={"N": [1000, "1000+"]})
    result = CliRunner().invoke(main, ["validate", str(write_config(tmp_path, ["t/target.yaml"])), "--build"])
    assert result.exit_code == 0, result.output
    [warning] = [line for line in result.output.splitlines() if "warning" in line]
    assert warning.startswith("tiny: warning: N=1000+ does not build (compile_error: tiny.c:") and \
        ": error: expected expression" in warning, warning


def test_a_relative_scratch_root_is_made_absolute(tmp_path, monkeypatch):
    """Seen: WARPFLEET_SCRATCH=scratch failed every build (the build runs in its own directory)."""
    from cluster.compile.build import compile_candidate
    from cluster.config import env
    from cluster.core.types import Candidate, Phase

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(env.SCRATCH, "scratch")
    root = env.scratch_root()
    assert root == tmp_path / "scratch" and root.is_absolute()
    target = load_target(write_target(tmp_path / "t"))
    candidate = Candidate("tiny", "cc", "cpu", "host", target.bundle.hash, tuple(target.baseline_flags.items()),
                          tuple(target.baseline_params.items()), Phase.BASELINE)
    assert compile_candidate(target, candidate, root).status.value == "ok"
    monkeypatch.setenv(env.SCRATCH, "")
    assert env.scratch_root() is None


def test_sampler_options_reach_the_sampler_and_a_wrong_one_is_a_config_error():
    from cluster.config.run import SearchSpec
    from cluster.engine.study.state import make_sampler

    sampler = make_sampler(SearchSpec(sampler="tpe", sampler_options={"n_startup_trials": 3}))
    assert sampler._n_startup_trials == 3
    with pytest.raises(ValueError, match="sampler_options: random does not take them"):
        SearchSpec(sampler="random", sampler_options={"n_startup_trials": 3})


def test_a_runner_is_a_registered_one_and_the_kernel_runner_is_a_kernel_targets():
    from cluster.config import TargetSpec

    base = {"name": "t", "sources": ["a.c"], "run": ["{binary}"]}
    assert TargetSpec(**base, runner="persistent").runner == "persistent"
    with pytest.raises(ValueError, match="unknown runner 'fast'"):
        TargetSpec(**base, runner="fast")
    with pytest.raises(ValueError, match="the kernel runner is a kernel target's"):
        TargetSpec(**base, runner="kernel")
