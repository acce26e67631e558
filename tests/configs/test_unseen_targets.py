"""The programs no expert was written for: the unseen ones (configs/unseen.yaml: four public programs
with only a user's edits and four small ones written for warpfleet, configs/unseen/README.md) and the
project's own (configs/own.yaml: four small ones, configs/own/README.md).

Without a compiler: the run config validates through the CLI and names every target, each target
loads with the settings a user's target has (no ``verify.sanitize_run``, one output file, one or two
params of 3 to 6 values, a seed unless its inputs are fixed), each folder records its origin (and,
for a public program, its licence and edits), the README's table lists every target, and the
read-only markers pair up around the output file and the program's own timing lines. With nvcc:
every baseline builds for sm_90, and every param reaches the program (its sources through the build
command's preprocessor with one other value differ from the baseline's; tests/configs/
test_public_targets.py has the control that shows the comparison can fail).

Builds and the preprocessor go the engine's way (tests/configs/_builds.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agents.patch import readonly_regions
from cluster.cli import main
from cluster.config import Target, load_run, load_target
from tests.configs._builds import Builds, other_value, preprocessed, preprocessed_baseline, wanted
from tests.conftest import needs

# One pytest-xdist worker runs the module: its builds start together on that worker's pool.
pytestmark = pytest.mark.xdist_group("nvcc_builds")

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
PUBLIC = {"pb_correlation", "rodinia_nw", "cs_fastWalshTransform", "cs_sortingNetworks"}  # fetched, not written here
# Each set: configs/<name>.yaml lists the targets of configs/<name>/, at least this many, these public.
SETS = {"unseen": (8, PUBLIC), "own": (4, set())}
TARGET_FILES = sorted(path for name in SETS for path in (CONFIGS / name).glob("*/target.yaml"))


def _id(path: Path) -> str:
    return path.parent.name


def _sources(target: Target) -> dict[str, str]:
    files = dict(target.bundle.files)
    return {name: files[name].decode() for name in target.spec.sources}


def _protected(target: Target) -> list[str]:
    """The text of every read-only region of the target's sources (the patch tools' own reading of the
    markers, which raises on unpaired or nested ones)."""
    return ["".join(lines[begin - 1:end])
            for text in _sources(target).values()
            for lines in [text.splitlines(keepends=True)]
            for begin, end in readonly_regions(text)]


def _uses_harness(target: Target) -> bool:
    return any("warpfleet/harness.cuh" in text for text in _sources(target).values())


# --- without a compiler ----------------------------------------------------------------------


@pytest.mark.parametrize("name", SETS)
def test_the_run_config_names_every_target_of_its_folder(name: str) -> None:
    plan = load_run(CONFIGS / f"{name}.yaml")
    names = {load_target(path).name for path in (CONFIGS / name).glob("*/target.yaml")}
    least, public = SETS[name]
    assert len(names) >= least and names >= public and names - public
    assert sorted(t.name for t in plan.targets) == sorted(names)


@pytest.mark.parametrize("name", SETS)
def test_the_run_config_validates_through_the_cli(name: str) -> None:
    result = CliRunner().invoke(main, ["validate", str(CONFIGS / f"{name}.yaml")])
    assert result.exit_code == 0, result.output
    listed = {line.split(":")[0] for line in result.output.splitlines()}
    assert listed == {t.name for t in load_run(CONFIGS / f"{name}.yaml").targets}


@pytest.mark.parametrize("name", SETS)
def test_the_readme_lists_every_target(name: str) -> None:
    readme = (CONFIGS / name / "README.md").read_text()
    rows = {line.split("|")[1].strip() for line in readme.splitlines() if line.startswith("| ")}
    assert {path.parent.name for path in (CONFIGS / name).glob("*/target.yaml")} <= rows


@pytest.mark.parametrize("path", TARGET_FILES, ids=_id)
def test_unseen_target_loads_with_a_users_settings(path: Path) -> None:
    target = load_target(path)
    spec = target.spec
    assert target.name == path.parent.name
    assert spec.toolchain == "nvcc" and spec.run[0] == "{binary}"
    # Without these the search's flags and params would never reach nvcc (nor the harness's header).
    wanted = {"{flags}", "{defines}", "-arch={arch}"} | ({"{harness_include}"} if _uses_harness(target) else set())
    assert wanted <= set(spec.build or [])
    assert [o.path for o in spec.verify.outputs] == ["out.bin"]
    assert not spec.verify.sanitize_run, "the benchmark measures the user's path: no smaller sanitizer run"
    assert (spec.timeouts.build, spec.timeouts.run) == (120, 60)
    assert 1 <= len(spec.params) <= 2 and all(3 <= len(values) <= 6 for values in spec.params.values())
    assert target.satisfies(target.baseline_params)
    fixed_inputs = "the run takes no seed" in " ".join((path.parent / "NOTES.md").read_text().split())
    assert fixed_inputs or any("{seed}" in arg for arg in spec.run)


@pytest.mark.parametrize("path", TARGET_FILES, ids=_id)
def test_program_folder_records_its_origin(path: Path) -> None:
    folder = path.parent
    notes = (folder / "NOTES.md").read_text()
    assert "## Shape" in notes and "## Params" in notes
    if folder.name in PUBLIC:
        assert re.search(r"https://github\.com/[\w.-]+/[\w.-]+", notes), "NOTES.md names no repository"
        assert re.search(r"\b[0-9a-f]{40}\b", notes), "NOTES.md gives no commit SHA"
        assert "## Edits" in notes and "## Licence" in notes
        assert "Redistribution and use in source and binary forms" in (folder / "LICENSE").read_text()
    else:
        assert "Written for warpfleet" in notes


@pytest.mark.parametrize("path", TARGET_FILES, ids=_id)
def test_readonly_regions_hold_the_output_and_the_timing(path: Path) -> None:
    """The output file is written inside a read-only region, and so are the program's own
    `@warpfleet time_ms=` lines where it prints them (the harness prints them itself)."""
    target = load_target(path)
    protected = _protected(target)
    assert any("out.bin" in region for region in protected)
    if not _uses_harness(target):
        assert any("@warpfleet time_ms=" in region for region in protected)


# --- with nvcc -------------------------------------------------------------------------------


PARAMS = [(path, name) for path in TARGET_FILES for name in load_target(path).spec.params]


@pytest.fixture(scope="module")
def builds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Builds]:
    started = Builds(tmp_path_factory.mktemp("unseen-builds"), wanted(request, "test_unseen_baseline_builds_for_sm90"))
    yield started
    started.pool.shutdown(cancel_futures=True)


@pytest.mark.nvcc
@needs("nvcc")
@pytest.mark.parametrize("path", TARGET_FILES, ids=_id)
def test_unseen_baseline_builds_for_sm90(builds: Builds, path: Path) -> None:
    assert builds.get(path).kernels, "ptxas reported no kernel"


@pytest.mark.nvcc
@needs("nvcc")
@pytest.mark.parametrize(("path", "name"), PARAMS, ids=[f"{_id(p)}-{n}" for p, n in PARAMS])
def test_each_param_reaches_the_program(tmp_path: Path, path: Path, name: str) -> None:
    target = load_target(path)
    other = {**target.baseline_params, name: other_value(target, name)}
    assert preprocessed(target, other, tmp_path) != preprocessed_baseline(path, tmp_path), \
        f"-D{name} does not reach the program"
