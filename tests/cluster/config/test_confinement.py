"""A target's sources and files stay in its folder, symbolic links followed (issue 16, attack 5)."""

from __future__ import annotations

import os

import pytest

from cluster.config import load_target
from cluster.core.errors import ConfigError
from tests.conftest import write_target


def _one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_a_source_linked_outside_the_folder_is_refused(tmp_path):
    path = write_target(tmp_path / "t")
    (tmp_path / "t" / "tiny.c").unlink()
    os.symlink("/etc/shadow", tmp_path / "t" / "tiny.c")
    with pytest.raises(ConfigError) as exc:
        load_target(path)
    message = _one_line(exc)
    assert "sources[0]" in message and "symbolic link" in message and "/etc/shadow" in message


def test_a_file_reached_through_a_linked_folder_is_refused(tmp_path):
    path = write_target(tmp_path / "t", files=["etc/hostname"])
    os.symlink("/etc", tmp_path / "t" / "etc")
    with pytest.raises(ConfigError) as exc:
        load_target(path)
    assert "files[0]" in _one_line(exc) and "symbolic link" in str(exc.value)


def test_links_that_stay_inside_the_folder_are_fine(tmp_path):
    path = write_target(tmp_path / "t", files=["data/in.txt", "alias.txt"])
    (tmp_path / "t" / "real").mkdir()
    (tmp_path / "t" / "real" / "in.txt").write_text("1 2 3\n")
    os.symlink("real", tmp_path / "t" / "data")
    os.symlink("real/in.txt", tmp_path / "t" / "alias.txt")
    target = load_target(path)
    assert dict(target.bundle.files)["alias.txt"] == b"1 2 3\n"


def test_a_target_folder_reached_through_a_link_is_fine(tmp_path):
    write_target(tmp_path / "real")
    os.symlink("real", tmp_path / "linked")
    assert load_target(tmp_path / "linked" / "target.yaml").name == "tiny"


def test_links_into_a_shared_folder_beside_the_target_are_fine(tmp_path):
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "helper.h").write_text("#define H 1\n")
    path = write_target(tmp_path / "t", files=["helper.h"], shared=["../common"])
    os.symlink("../common/helper.h", tmp_path / "t" / "helper.h")
    assert dict(load_target(path).bundle.files)["helper.h"] == b"#define H 1\n"


@pytest.mark.parametrize("shared", ["/etc", "..", "../.."])
def test_a_shared_folder_is_beside_the_target_not_above_it_or_absolute(tmp_path, shared):
    path = write_target(tmp_path / "t", shared=[shared])
    with pytest.raises(ConfigError) as exc:
        load_target(path)
    assert "shared[0]" in _one_line(exc)


@pytest.mark.parametrize("output", ["/etc/shadow", "../references/out.bin", "data/../../x.bin", ""])
def test_an_output_path_outside_the_scratch_directory_is_refused(tmp_path, output):
    path = write_target(tmp_path / "t", verify={"outputs": [{"path": output}]})
    with pytest.raises(ConfigError) as exc:
        load_target(path)
    message = _one_line(exc)
    assert "target.yaml" in message and "verify.outputs[0].path" in message


def test_an_output_in_a_folder_of_the_scratch_directory_is_fine(tmp_path):
    target = load_target(write_target(tmp_path / "t", verify={"outputs": ["results/out.bin", "./c.txt"]}))
    assert [o.path for o in target.spec.verify.outputs] == ["results/out.bin", "./c.txt"]
