"""The public-program suite (configs/public.yaml): CUDA programs this project did not write, each
with only a user's edits (configs/public/<name>/NOTES.md lists them).

Without a compiler: every target loads, the run config validates through the CLI and names every
baseline, each program folder records its origin and licence, and the read-only markers pair up
around the output file. With nvcc: every baseline builds for sm_90, and every param reaches the
program: its sources through the build command's preprocessor with one other value differ from the
baseline's. A param whose macro a source defines without an ``#ifndef`` guard fails that test, since
the source's ``#define`` overrides the ``-D``; the control test shows that such a program is the same
as the baseline's once the preprocessor's line markers are dropped.

Builds and the preprocessor go the engine's way (tests/configs/_builds.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agents.patch import readonly_regions
from cluster.cli import main
from cluster.config import load_run, load_target
from tests.configs._builds import Builds, other_value, preprocessed, preprocessed_baseline, wanted
from tests.conftest import needs

# One pytest-xdist worker runs the module: its builds start together on that worker's pool.
pytestmark = pytest.mark.xdist_group("nvcc_builds")

REPO = Path(__file__).resolve().parents[2]
RUN_CONFIG = REPO / "configs" / "public.yaml"
PUBLIC = REPO / "configs" / "public"
TARGET_FILES = sorted(PUBLIC.glob("*/target*.yaml"))
PROGRAMS = sorted({path.parent for path in TARGET_FILES})


def _id(path: Path) -> str:
    return str(path.relative_to(PUBLIC))


# --- without a compiler ----------------------------------------------------------------------


def test_the_run_config_names_every_public_baseline() -> None:
    plan = load_run(RUN_CONFIG)
    baselines = {load_target(path).name for path in TARGET_FILES if path.name == "target.yaml"}
    assert len(baselines) >= 8
    assert sorted(t.name for t in plan.targets) == sorted(baselines)


def test_the_run_config_validates_through_the_cli() -> None:
    result = CliRunner().invoke(main, ["validate", str(RUN_CONFIG)])
    assert result.exit_code == 0, result.output
    listed = {line.split(":")[0] for line in result.output.splitlines()}
    assert listed == {t.name for t in load_run(RUN_CONFIG).targets}


@pytest.mark.parametrize("path", TARGET_FILES, ids=_id)
def test_public_target_loads(path: Path) -> None:
    target = load_target(path)
    suffix = "_opt" if path.name == "target_opt.yaml" else ""
    assert target.name == path.parent.name + suffix
    spec = target.spec
    assert spec.toolchain == "nvcc" and spec.run[0] == "{binary}"
    # Without these the search's flags and params would never reach nvcc.
    assert {"{flags}", "{defines}", "{harness_include}", "-arch={arch}"} <= set(spec.build or [])
    assert [o.path for o in spec.verify.outputs] == ["out.bin"]
    assert target.satisfies(target.baseline_params)


@pytest.mark.parametrize("path", [p for p in TARGET_FILES if p.name == "target_opt.yaml"], ids=_id)
def test_opt_target_runs_and_checks_like_its_baseline(path: Path) -> None:
    opt, plain = load_target(path).spec, load_target(path.with_name("target.yaml")).spec
    assert (opt.run, opt.verify, opt.files) == (plain.run, plain.verify, plain.files)


@pytest.mark.parametrize("folder", PROGRAMS, ids=lambda p: p.name)
def test_program_folder_records_origin_and_licence(folder: Path) -> None:
    notes = (folder / "NOTES.md").read_text()
    assert re.search(r"https://github\.com/[\w.-]+/[\w.-]+", notes), "NOTES.md names no repository"
    assert re.search(r"\b[0-9a-f]{40}\b", notes), "NOTES.md gives no commit SHA"
    assert "## Edits" in notes and "## Licence" in notes
    assert "Redistribution and use in source and binary forms" in (folder / "LICENSE").read_text()


@pytest.mark.parametrize("path", TARGET_FILES, ids=_id)
def test_readonly_regions_pair_up_and_hold_the_output(path: Path) -> None:
    """The patch tools' own reading of the markers (it raises on unpaired or nested ones), and the
    output file is written inside a region, out of the agents' reach."""
    target = load_target(path)
    files = {name: content.decode() for name, content in target.bundle.files}
    protected = [
        "".join(lines[begin - 1:end])
        for name in target.spec.sources
        for lines in [files[name].splitlines(keepends=True)]
        for begin, end in readonly_regions(files[name])
    ]
    assert any("write_output(" in region for region in protected)


# --- with nvcc -------------------------------------------------------------------------------


PARAMS = [(path, name) for path in TARGET_FILES for name in load_target(path).spec.params]


@pytest.fixture(scope="module")
def builds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Builds]:
    started = Builds(tmp_path_factory.mktemp("public-builds"), wanted(request, "test_public_baseline_builds_for_sm90"))
    yield started
    started.pool.shutdown(cancel_futures=True)


@pytest.mark.nvcc
@needs("nvcc")
@pytest.mark.parametrize("path", TARGET_FILES, ids=_id)
def test_public_baseline_builds_for_sm90(builds: Builds, path: Path) -> None:
    artifact = builds.get(path)
    assert artifact.kernels, "ptxas reported no kernel"


@pytest.mark.nvcc
@needs("nvcc")
@pytest.mark.parametrize(("path", "name"), PARAMS, ids=[f"{_id(p)}-{n}" for p, n in PARAMS])
def test_each_param_reaches_the_program(tmp_path: Path, path: Path, name: str) -> None:
    target = load_target(path)
    other = {**target.baseline_params, name: other_value(target, name)}
    assert preprocessed(target, other, tmp_path) != preprocessed_baseline(path, tmp_path), \
        f"-D{name} does not reach the program"


UNGUARDED = """
#define WIDTH 4
__global__ void fill(float* out) { out[threadIdx.x] = WIDTH; }
int main() { fill<<<1, WIDTH>>>(nullptr); return 0; }
"""


@pytest.mark.nvcc
@needs("nvcc")
def test_an_unguarded_macro_leaves_the_program_unchanged(tmp_path: Path) -> None:
    """The control of the test above: it can fail. The source's #define wins over -DWIDTH=8, and the
    two programs, staged in different folders, are the same once the preprocessor's line markers
    are dropped; a guarded one differs."""
    folder = tmp_path / "unguarded"
    folder.mkdir()
    (folder / "unguarded.cu").write_text(UNGUARDED)
    spec = {"name": "unguarded", "sources": ["unguarded.cu"], "run": ["{binary}"], "params": {"WIDTH": [4, 8]}}
    (folder / "target.yaml").write_text(yaml.safe_dump(spec))
    target = load_target(folder / "target.yaml")
    assert preprocessed(target, {"WIDTH": 4}, tmp_path / "a") == preprocessed(target, {"WIDTH": 8}, tmp_path / "b")
    (folder / "unguarded.cu").write_text(UNGUARDED.replace("#define WIDTH 4", "#ifndef WIDTH\n#define WIDTH 4\n#endif"))
    guarded = load_target(folder / "target.yaml")
    assert preprocessed(guarded, {"WIDTH": 4}, tmp_path / "a") != preprocessed(guarded, {"WIDTH": 8}, tmp_path / "b")
