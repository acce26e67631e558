"""The patch tools: edit kinds, line numbers on the original file, read-only regions, declared
sources, the diff and its limit, atomicity, variants and their bundles."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agents.patch import (
    Delete,
    InsertAfter,
    InsertAtAnchor,
    InsertBefore,
    MarkerError,
    Patched,
    Refused,
    Replace,
    ReplaceText,
    Rule,
    Variant,
    apply,
    readonly_regions,
    source_files,
    variant_bundle,
)
from cluster.config import load_target

REPO = Path(__file__).resolve().parents[2]

# A tiled transpose whose timing and verification (and output) are the target's, not the agents'.
KERNEL = r"""// transpose: out = in^T through a shared-memory tile.
#include <warpfleet/harness.cuh>

#include <cstdio>
#include <vector>

#ifndef TILE
#define TILE 32
#endif
#ifndef BLOCK_ROWS
#define BLOCK_ROWS 8
#endif

__global__ void transpose(const float* __restrict__ in, float* __restrict__ out, int n) {
  __shared__ float tile[TILE][TILE];
  int x = blockIdx.x * TILE + threadIdx.x;
  int y = blockIdx.y * TILE + threadIdx.y;
  for (int j = 0; j < TILE; j += BLOCK_ROWS) tile[threadIdx.y + j][threadIdx.x] = in[size_t(y + j) * n + x];
  __syncthreads();
  x = blockIdx.y * TILE + threadIdx.x;
  y = blockIdx.x * TILE + threadIdx.y;
  for (int j = 0; j < TILE; j += BLOCK_ROWS) out[size_t(y + j) * n + x] = tile[threadIdx.x][threadIdx.y + j];
}

int main(int argc, char** argv) {
  const wf::Options opt = wf::parse_options(argc, argv, nullptr);
  const int n = 4096;
  const size_t bytes = size_t(n) * n * sizeof(float);
  std::vector<float> in(size_t(n) * n), out(size_t(n) * n);
  wf::fill_uniform(in.data(), in.size(), opt.seed);
  float *d_in = nullptr, *d_out = nullptr;
  WF_CHECK(cudaMalloc(&d_in, bytes));
  WF_CHECK(cudaMalloc(&d_out, bytes));
  WF_CHECK(cudaMemcpy(d_in, in.data(), bytes, cudaMemcpyHostToDevice));
  const dim3 grid(n / TILE, n / TILE), block(TILE, BLOCK_ROWS);
  // warpfleet: readonly begin (timing and verification belong to the target)
  wf::bench(opt, [&](cudaStream_t stream) { transpose<<<grid, block, 0, stream>>>(d_in, d_out, n); });
  WF_CHECK(cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost));
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n; ++c)
      if (!(out[size_t(r) * n + c] == in[size_t(c) * n + r])) {
        std::fprintf(stderr, "transpose: out[%d][%d] is wrong\n", r, c);
        return 1;
      }
  // warpfleet: readonly end
  WF_CHECK(cudaFree(d_in));
  WF_CHECK(cudaFree(d_out));
  /* warpfleet: readonly begin */
  wf::write_output("out.bin", out.data(), out.size());
  /* warpfleet: readonly end */
  return 0;
}
"""
PATH = "transpose.cu"
FILES = {PATH: KERNEL, "helpers.cuh": "#pragma once\n__device__ inline float twice(float v) { return 2 * v; }\n",
         "input.txt": "4096\n"}
EDITABLE = [PATH, "helpers.cuh"]  # input.txt is a run file, not a source
LINES = KERNEL.splitlines(keepends=True)


def line_of(needle: str, text: str = KERNEL) -> int:
    """The 1-based number of the one line of ``text`` that contains ``needle``."""
    found = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(found) == 1, (needle, found)
    return found[0]


BEGIN = line_of("// warpfleet: readonly begin")
END = line_of("// warpfleet: readonly end")
BEGIN2 = line_of("/* warpfleet: readonly begin */")
END2 = line_of("/* warpfleet: readonly end */")
SYNC = line_of("__syncthreads();")
TILE_DECL = line_of("__shared__ float tile")


def patched(*edits, files=FILES, editable=EDITABLE, limit=None) -> Patched:
    result = apply(files, edits, editable, limit)
    assert isinstance(result, Patched), result
    return result


def refused(*edits, files=FILES, editable=EDITABLE, limit=None) -> Refused:
    result = apply(files, edits, editable, limit)
    assert isinstance(result, Refused), result
    return result


def new_kernel(result: Patched) -> str:
    return dict(result.files)[PATH]


def test_readonly_regions_of_both_marker_forms() -> None:
    assert readonly_regions(KERNEL) == [(BEGIN, END), (BEGIN2, END2)]
    assert readonly_regions("int x;\n") == []


# --- every edit kind ---

def test_insert_before_and_after() -> None:
    text = "  // padded tile next\n"
    before = new_kernel(patched(InsertBefore(PATH, TILE_DECL, text)))
    assert before == "".join([*LINES[:TILE_DECL - 1], text, *LINES[TILE_DECL - 1:]])
    after = new_kernel(patched(InsertAfter(PATH, TILE_DECL, text.rstrip("\n"))))  # newline added
    assert after == "".join([*LINES[:TILE_DECL], text, *LINES[TILE_DECL:]])


def test_insert_at_the_file_ends() -> None:
    assert new_kernel(patched(InsertAfter(PATH, 0, "// top\n"))) == "// top\n" + KERNEL
    assert new_kernel(patched(InsertBefore(PATH, len(LINES) + 1, "// end\n"))) == KERNEL + "// end\n"
    assert refused(InsertBefore(PATH, len(LINES) + 2, "x\n")).rule is Rule.LINE_RANGE
    assert refused(InsertAfter(PATH, -1, "x\n")).rule is Rule.LINE_RANGE


def test_insert_at_anchor_after_and_before() -> None:
    after = new_kernel(patched(InsertAtAnchor(PATH, "__syncthreads();", "  // tile loaded\n")))
    assert after.splitlines()[SYNC] == "  // tile loaded"  # the line after the anchor's line
    before = new_kernel(patched(InsertAtAnchor(PATH, "__syncthreads();", "  // barrier\n", after=False)))
    assert before.splitlines()[SYNC - 1] == "  // barrier"
    assert before.splitlines()[SYNC] == "  __syncthreads();"
    at_line_start = new_kernel(patched(InsertAtAnchor(PATH, "#ifndef BLOCK_ROWS", "// rows\n", after=False)))
    assert at_line_start.splitlines()[line_of("#ifndef BLOCK_ROWS") - 1:][:2] == ["// rows", "#ifndef BLOCK_ROWS"]


def test_insert_at_anchor_spanning_lines_goes_after_its_last_line() -> None:
    anchor = "  __syncthreads();\n  x = blockIdx.y"
    result = new_kernel(patched(InsertAtAnchor(PATH, anchor, "// here\n")))
    assert result.splitlines()[SYNC + 1] == "// here"


def test_insert_at_anchor_occurrences() -> None:
    anchor = "for (int j = 0; j < TILE; j += BLOCK_ROWS)"  # the load loop, then the store loop
    second = line_of("out[size_t(y + j)")
    result = new_kernel(patched(InsertAtAnchor(PATH, anchor, "#pragma unroll\n", after=False, occurrence=2)))
    assert result.splitlines()[second - 1] == "#pragma unroll"
    assert result.count("#pragma unroll") == 1
    ambiguous = refused(InsertAtAnchor(PATH, anchor, "#pragma unroll\n", occurrence=None))
    assert ambiguous.rule is Rule.ANCHOR and ambiguous.line == line_of("tile[threadIdx.y + j]")
    assert f"occurs 2 times (lines {ambiguous.line}, {second})" in ambiguous.reason
    assert refused(InsertAtAnchor(PATH, anchor, "x\n", occurrence=3)).rule is Rule.ANCHOR
    assert refused(InsertAtAnchor(PATH, "__nosuch__", "x\n", occurrence=None)).rule is Rule.ANCHOR
    unique = patched(InsertAtAnchor(PATH, "__syncthreads();", "// ok\n", occurrence=None))
    assert "// ok\n" in new_kernel(unique)


def test_replace_lines() -> None:
    result = new_kernel(patched(Replace(PATH, TILE_DECL, TILE_DECL, "  __shared__ float tile[TILE][TILE + 1];")))
    assert result.splitlines()[TILE_DECL - 1] == "  __shared__ float tile[TILE][TILE + 1];"
    assert len(result.splitlines()) == len(LINES)
    two = new_kernel(patched(Replace(PATH, SYNC - 1, SYNC, "  // one line for two\n")))
    assert len(two.splitlines()) == len(LINES) - 1
    assert refused(Replace(PATH, SYNC, SYNC - 1, "x")).rule is Rule.LINE_RANGE
    assert refused(Replace(PATH, 1, len(LINES) + 1, "x")).rule is Rule.LINE_RANGE


def test_replace_text() -> None:
    result = patched(ReplaceText(PATH, "tile[TILE][TILE];", "tile[TILE][TILE + 1];"))
    assert new_kernel(result) == KERNEL.replace("tile[TILE][TILE];", "tile[TILE][TILE + 1];")
    assert result.changed_lines == 2  # one line removed, one added


def test_replace_text_counts_occurrences() -> None:
    twice = refused(ReplaceText(PATH, "blockIdx.x * TILE", "bx"))
    assert twice.rule is Rule.TEXT_COUNT and "occurs 2 times" in twice.reason and "expected exactly 1" in twice.reason
    assert refused(ReplaceText(PATH, "blockIdx.x * TILE", "bx", count=3)).rule is Rule.TEXT_COUNT
    assert refused(ReplaceText(PATH, "__nosuch__", "x")).rule is Rule.TEXT_COUNT
    both = new_kernel(patched(ReplaceText(PATH, "blockIdx.x * TILE", "bx", count=2)))
    assert both == KERNEL.replace("blockIdx.x * TILE", "bx")


def test_replace_text_on_a_last_line_without_newline() -> None:
    result = patched(ReplaceText("k.cu", "int b", "long b"), files={"k.cu": "int a;\nint b;"}, editable=["k.cu"])
    assert result.files == (("k.cu", "int a;\nlong b;"),)


def test_replace_text_several_on_one_line() -> None:
    result = patched(ReplaceText(PATH, "[TILE]", "[TILE_DIM]", count=2))  # both on the tile's line
    assert new_kernel(result) == KERNEL.replace("[TILE]", "[TILE_DIM]")
    assert result.changed_lines == 2
    lines = patched(ReplaceText(PATH, "threadIdx.y + j", "ty_j", count=2))  # the load line and the store line
    assert new_kernel(lines) == KERNEL.replace("threadIdx.y + j", "ty_j")
    assert lines.changed_lines == 4


def test_delete_lines() -> None:
    result = patched(Delete(PATH, SYNC, SYNC))
    assert new_kernel(result) == "".join(LINES[:SYNC - 1] + LINES[SYNC:])
    assert result.changed_lines == 1
    assert new_kernel(patched(Delete(PATH, len(LINES), len(LINES)))) == "".join(LINES[:-1])
    assert refused(Delete(PATH, 0, 1)).rule is Rule.LINE_RANGE


# --- several edits: line numbers are the original file's ---

def test_line_numbers_refer_to_the_original_file() -> None:
    first, last = line_of("#ifndef BLOCK_ROWS"), line_of("#define BLOCK_ROWS 8")
    result = new_kernel(patched(
        InsertBefore(PATH, TILE_DECL, "  // a\n  // b\n  // c\n"),  # three lines above the others
        Replace(PATH, SYNC, SYNC, "  __syncthreads();  // tile complete\n"),
        Delete(PATH, first, last + 1),  # a block above: moves the later edits' lines, not their targets
        InsertAfter(PATH, 1, "// top\n"),
    ))
    expected = [*LINES[:1], "// top\n", *LINES[1:first - 1], *LINES[last + 1:TILE_DECL - 1],
                "  // a\n  // b\n  // c\n", *LINES[TILE_DECL - 1:SYNC - 1],
                "  __syncthreads();  // tile complete\n", *LINES[SYNC:]]
    assert result == "".join(expected)


def test_edits_in_several_files_of_one_call() -> None:
    result = patched(ReplaceText("helpers.cuh", "2 * v", "v + v"), InsertAfter(PATH, 2, "#include \"helpers.cuh\"\n"))
    assert [path for path, _ in result.files] == [PATH, "helpers.cuh"]
    assert "v + v" in dict(result.files)["helpers.cuh"]
    assert "a/helpers.cuh" in result.diff and "b/transpose.cu" in result.diff


def test_overlapping_edits_are_refused() -> None:
    overlap = refused(Replace(PATH, SYNC - 1, SYNC, "x\n"), Delete(PATH, SYNC, SYNC + 1))
    assert overlap.rule is Rule.OVERLAP and overlap.edit == 1 and "edit 0" in overlap.reason
    inside = refused(Replace(PATH, SYNC - 1, SYNC + 1, "x\n"), InsertAfter(PATH, SYNC, "y\n"))
    assert inside.rule is Rule.OVERLAP
    same_line = refused(ReplaceText(PATH, "tile[TILE][TILE]", "t"), Replace(PATH, TILE_DECL, TILE_DECL, "z\n"))
    assert same_line.rule is Rule.OVERLAP


def test_insertions_at_a_replaced_range_boundary_are_not_overlaps() -> None:
    result = new_kernel(patched(
        Replace(PATH, SYNC, SYNC, "  // replaced\n"),
        InsertAfter(PATH, SYNC, "  // after\n"),
        InsertBefore(PATH, SYNC, "  // before\n"),
    ))
    assert result.splitlines()[SYNC - 1:SYNC + 2] == ["  // before", "  // replaced", "  // after"]


# --- read-only regions ---

@pytest.mark.parametrize("edit", [
    Replace(PATH, BEGIN + 1, BEGIN + 1, "  // timing removed\n"),
    Delete(PATH, BEGIN + 2, BEGIN + 3),
    InsertAfter(PATH, BEGIN, "  // inside\n"),  # directly after the begin marker
    InsertBefore(PATH, END, "  // inside\n"),  # directly before the end marker
    InsertBefore(PATH, BEGIN2 + 1, "  // inside\n"),
    ReplaceText(PATH, "return 1;", "return 0;"),
    InsertAtAnchor(PATH, "return 1;", "  // inside\n"),
], ids=["replace", "delete", "after-begin", "before-end", "second-region", "text", "anchor"])
def test_edits_touching_a_readonly_region_are_refused(edit) -> None:
    result = refused(edit)
    assert result.rule is Rule.READONLY and result.path == PATH
    assert BEGIN <= result.line <= END or BEGIN2 <= result.line <= END2
    assert "read-only region" in result.reason and result.reason.startswith(f"{PATH}:{result.line}: ")


@pytest.mark.parametrize("edit", [
    InsertBefore(PATH, BEGIN, "  // before the region\n"),
    InsertAfter(PATH, END, "  // after the region\n"),
    InsertAfter(PATH, END2, "  // after the second region\n"),
    InsertAtAnchor(PATH, "// warpfleet: readonly end", "  // after the region\n"),
    Replace(PATH, BEGIN - 1, BEGIN - 1, "  const dim3 grid(n / TILE, n / TILE), block(TILE, TILE / 4);\n"),
    Delete(PATH, END + 1, BEGIN2 - 1),  # every line between the regions
], ids=["before-begin", "after-end", "after-end2", "anchor-end", "line-above", "between"])
def test_edits_around_a_readonly_region_are_allowed(edit) -> None:
    result = patched(edit)
    assert readonly_regions(new_kernel(result))  # still there, and well formed
    kept = [line for line in new_kernel(result).splitlines(keepends=True) if line in LINES[BEGIN - 1:END]]
    assert kept == LINES[BEGIN - 1:END]


@pytest.mark.parametrize("edit", [
    Delete(PATH, BEGIN, BEGIN),
    Delete(PATH, BEGIN - 1, BEGIN),
    Replace(PATH, END, END + 1, "x\n"),
    ReplaceText(PATH, "readonly end\n", "readonly end (now editable)\n"),
    Delete(PATH, BEGIN2, END2),
], ids=["begin", "above-and-begin", "end-and-below", "alter", "whole-region"])
def test_removing_or_altering_a_marker_is_refused(edit) -> None:
    result = refused(edit)
    assert result.rule is Rule.READONLY_MARKER
    assert result.line in (BEGIN, END, BEGIN2, END2)


@pytest.mark.parametrize("text", ["  // warpfleet: readonly end\n", "/* warpfleet: readonly begin */\n"])
def test_adding_a_marker_is_refused(text) -> None:
    assert refused(InsertBefore(PATH, BEGIN, text)).rule is Rule.READONLY_MARKER


@pytest.mark.parametrize(("source", "line", "words"), [
    ("a\n// warpfleet: readonly begin\nb\n", 2, "without an end"),
    ("a\n// warpfleet: readonly end\n", 2, "without a begin"),
    ("// warpfleet: readonly begin\n/* warpfleet: readonly begin */\n// warpfleet: readonly end\n", 2, "inside"),
    ("int x;  // warpfleet: readonly begin\n// warpfleet: readonly end\n", 1, "alone"),
    ("// warpfleet: readonly begin\n/* warpfleet: readonly end */ int x;\n", 2, "alone"),
])
def test_unbalanced_or_malformed_markers_are_reported(source, line, words) -> None:
    with pytest.raises(MarkerError, match=words) as info:
        readonly_regions(source)
    assert info.value.line == line
    result = refused(InsertAfter("k.cu", 0, "// x\n"), files={"k.cu": source}, editable=["k.cu"])
    assert result.rule is Rule.MARKERS and result.line == line and result.path == "k.cu"


# --- which files ---

def test_files_outside_the_declared_sources_are_refused() -> None:
    result = refused(Replace("input.txt", 1, 1, "8192\n"))  # given, but a run file
    assert result.rule is Rule.NOT_EDITABLE and result.path == "input.txt"
    assert refused(InsertAfter("other.cu", 0, "x\n")).rule is Rule.NOT_EDITABLE
    missing = refused(InsertAfter("kernel2.cu", 0, "x\n"), editable=[*EDITABLE, "kernel2.cu"])
    assert missing.rule is Rule.NOT_EDITABLE and "not among the files given" in missing.reason


@pytest.mark.parametrize("path", ["../transpose.cu", "sub/../../transpose.cu", "/work/transpose.cu", ""])
def test_paths_leaving_the_target_are_refused(path) -> None:
    assert refused(InsertAfter(path, 0, "x\n")).rule is Rule.PATH


def test_paths_are_normalized_and_results_keep_the_callers_names() -> None:
    result = patched(InsertAfter("./transpose.cu", 0, "// x\n"), InsertAfter("src//k.cu", 0, "// y\n"),
                     files={PATH: KERNEL, "./src/k.cu": "int k;\n"}, editable=[PATH, "src/./k.cu"])
    assert [path for path, _ in result.files] == [PATH, "./src/k.cu"]


# --- diff, limit, atomicity ---

def test_changed_lines_and_the_limit() -> None:
    edits = (Replace(PATH, SYNC, SYNC, "  // a\n  // b\n"), InsertAfter(PATH, 0, "// c\n"))  # -1 +2, +1
    assert patched(*edits).changed_lines == 4
    assert patched(*edits, limit=4).changed_lines == 4
    over = refused(*edits, limit=3)
    assert over.rule is Rule.LIMIT and PATH in over.reason and "4 changed lines" in over.reason


def test_a_refused_edit_among_valid_ones_changes_nothing() -> None:
    files = dict(FILES)
    result = refused(InsertAfter(PATH, 0, "// a\n"), ReplaceText("helpers.cuh", "2 * v", "v + v"),
                     Delete(PATH, BEGIN + 1, BEGIN + 1), InsertAfter(PATH, 1, "// b\n"), files=files)
    assert result.edit == 2 and result.rule is Rule.READONLY
    assert files == FILES and not hasattr(result, "files")


def test_edits_that_change_nothing_are_refused() -> None:
    assert refused().rule is Rule.NO_CHANGE
    assert refused(ReplaceText(PATH, "__syncthreads();", "__syncthreads();")).rule is Rule.NO_CHANGE
    assert refused(InsertAfter(PATH, 3, "")).rule is Rule.NO_CHANGE


def patch_back(tmp_path: Path, files: dict[str, str], result: Patched) -> dict[str, str]:
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "change.diff").write_text(result.diff)
    subprocess.run(["patch", "-p1", "--batch", "-i", "change.diff"], cwd=tmp_path, check=True,
                   capture_output=True)
    return {path: (tmp_path / path).read_text() for path in files}


@pytest.mark.skipif(shutil.which("patch") is None, reason="patch not on PATH")
def test_the_diff_applies_back_with_patch(tmp_path: Path) -> None:
    # tail.cu: a form feed, which is no line break, and a last line without a newline
    files = {PATH: KERNEL, "include/helpers.cuh": FILES["helpers.cuh"], "tail.cu": "int a;\x0c\nint b;"}
    result = patched(
        ReplaceText(PATH, "tile[TILE][TILE];", "tile[TILE][TILE + 1];"),
        InsertAfter(PATH, END, "  // freed below\n"),
        Delete(PATH, 1, 1),
        InsertAfter("include/helpers.cuh", 2, "__device__ inline float half(float v) { return v / 2; }\n"),
        InsertAfter("tail.cu", 2, "int c;"),
        files=files, editable=list(files))
    assert result.diff.count("--- a/") == 3 and "\\ No newline at end of file" in result.diff
    assert patch_back(tmp_path, files, result) == {**files, **dict(result.files)}
    assert dict(result.files)["tail.cu"] == "int a;\x0c\nint b;\nint c;\n"


# --- variants ---

def variant(description: str = "pad the tile", parent: str = "p0", old: str = "tile[TILE][TILE];",
            new: str = "tile[TILE][TILE + 1];") -> Variant:
    return Variant.of(patched(ReplaceText(PATH, old, new)), description, parent)


def test_variant_hashes_are_content_hashes() -> None:
    first = variant()
    assert first.diff and first.files and first.parent == "p0"
    assert variant().hash == first.hash
    assert variant(description="the same edit by another agent").hash == first.hash
    assert variant(parent="p1").hash != first.hash
    assert variant(new="tile[TILE][TILE + 2];").hash != first.hash
    assert len({first.hash, variant(parent="p1").hash, variant(new="tile[TILE][TILE + 2];").hash}) == 3


def test_variant_hashes_are_the_same_in_another_process() -> None:
    code = ("from agents.patch import Variant; import sys; "
            "print(Variant(((sys.argv[1], sys.argv[2]),), 'diff', 'why', 'p0').hash)")
    first = variant()
    (path, text), = first.files
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code, path, text], cwd=REPO, check=True, capture_output=True,
                             text=True, env={"PYTHONHASHSEED": seed, "PATH": ""})
        assert out.stdout.strip() == first.hash


def write_transpose_target(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in FILES.items():
        (folder / path).write_text(text)
    spec = {"name": "transpose", "toolchain": "nvcc", "sources": [PATH, "helpers.cuh"], "files": ["input.txt"],
            "run": ["{binary}"], "verify": {"outputs": ["out.bin"]}}
    (folder / "target.yaml").write_text(yaml.safe_dump(spec))
    return folder / "target.yaml"


def test_variant_bundle_substitutes_the_changed_sources(tmp_path: Path) -> None:
    target = load_target(write_transpose_target(tmp_path))
    assert source_files(target) == {PATH: KERNEL, "helpers.cuh": FILES["helpers.cuh"]}
    result = apply(source_files(target), [ReplaceText(PATH, "tile[TILE][TILE];", "tile[TILE][TILE + 1];")],
                   target.spec.sources)
    assert isinstance(result, Patched)
    bundle = variant_bundle(target, result)
    assert bundle.hash != target.bundle.hash
    assert [path for path, _ in bundle.files] == [path for path, _ in target.bundle.files]
    contents, original = dict(bundle.files), dict(target.bundle.files)
    assert contents[PATH] == new_kernel(result).encode()
    assert contents["helpers.cuh"] == original["helpers.cuh"] and contents["input.txt"] == original["input.txt"]
    kept = Variant.of(result, "pad the tile", target.bundle.hash)
    assert variant_bundle(target, kept) == bundle  # a kept variant builds the same bundle


def test_variant_bundle_refuses_files_that_are_not_sources(tmp_path: Path) -> None:
    target = load_target(write_transpose_target(tmp_path))
    with pytest.raises(ValueError, match=r"input\.txt"):
        variant_bundle(target, Patched((("input.txt", "1\n"),), "", 1))
