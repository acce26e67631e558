"""agents.cuda_source: facts from every suite target's source, and synthetic sources that trip
up a naive reader (comments and strings holding CUDA syntax, #if 0, macros, templates, aliases)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agents import _ts
from agents.cuda_source import analyze
from agents.source_model import HostOpKind, Kernel, SourceModel, read_params, written_params
from cluster.compile.build import HARNESS_INCLUDE

TARGETS = Path(__file__).resolve().parents[2] / "configs" / "targets"
HARNESS = HARNESS_INCLUDE / "warpfleet" / "harness.cuh"
# The programs: a kernel target (transpose_kernel) is a bare kernel, with no launch of its own.
SUITE = sorted(p for p in TARGETS.glob("*/*.cu") if p.parent.name != "transpose_kernel")


def suite(name: str, **defines: int) -> SourceModel:
    path = TARGETS / name.split("_")[0] / f"{name}.cu"
    return analyze(path.read_text(), str(path), defines=defines)


def kinds(model: SourceModel, function: str) -> list[str]:
    return [op.kind.value for op in model.ops_in(function)]


# -- the suite targets ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", [*SUITE, HARNESS], ids=lambda p: p.name)
def test_every_suite_source_parses_without_errors_and_launches_its_kernels(path: Path) -> None:
    model = analyze(path.read_text(), str(path))
    assert model.errors == ()
    assert model.kernels
    assert {launch.kernel for launch in model.launches} <= {k.name for k in model.kernels}
    assert model.launches


def test_suite_has_the_sources_these_tests_name() -> None:
    assert {p.stem for p in SUITE} >= {"transpose", "transpose_opt", "unroll", "unroll_opt", "regpressure",
                                       "regpressure_opt", "multikernel", "multikernel_opt", "matmul", "matmul_opt",
                                       "conv2d", "conv2d_opt", "saxpy"}


def test_transpose_shared_tile_dims_resolve_from_the_files_defaults_and_from_defines() -> None:
    model = suite("transpose")
    (kernel,) = model.kernels
    assert kernel.name == "transpose" and kernel.launch_bounds is None
    (tile,) = kernel.shared
    assert (tile.name, tile.element_type, tile.dims) == ("tile", "float", ("TILE", "TILE + PAD"))
    assert tile.dim_values == (32, 32) and not tile.is_dynamic and tile.kernel == "transpose"
    source = (TARGETS / "transpose" / "transpose.cu").read_text()
    assert source[tile.span.start : tile.span.end] == "__shared__ float tile[TILE][TILE + PAD];"
    assert source.splitlines()[tile.line - 1].strip().startswith("__shared__ float tile")
    assert suite("transpose", PAD=1).kernels[0].shared[0].dim_values == (32, 33)
    assert suite("transpose", TILE=16).kernels[0].shared[0].dim_values == (16, 16)
    assert suite("transpose_opt").kernels[0].shared[0].dim_values == (32, 33)


def test_transpose_accesses_show_the_column_wise_read() -> None:
    (tile,) = suite("transpose").kernels[0].shared
    assert [(a.indices, a.is_write) for a in tile.accesses] == [
        (("threadIdx.y + j", "threadIdx.x"), True),
        (("threadIdx.x", "threadIdx.y + j"), False),  # a warp reads down a column: bank conflicts
    ]


def test_transpose_kernel_params_loops_and_host_order() -> None:
    model = suite("transpose")
    kernel = model.kernel("transpose")
    inp, out = kernel.param("in"), kernel.param("out")
    assert (inp.type, inp.is_pointer, inp.is_const_pointee, inp.is_restrict) == ("const float* __restrict__", True,
                                                                                 True, True)
    assert (out.is_pointer, out.is_const_pointee) == (True, False)
    assert not kernel.param("rows").is_pointer
    assert [(loop.variable, loop.trip_count, loop.unroll is not None) for loop in kernel.loops] == [
        ("j", 4, True), ("j", 4, True)]
    assert suite("transpose", BLOCK_ROWS=4).kernel("transpose").loops[0].trip_count == 8
    assert kinds(model, "main") == ["memcpy", "memset", "launch", "memcpy"]
    launch = model.ops_in("main")[2].launch
    assert launch is not None
    assert (launch.kernel, launch.grid, launch.block, launch.shared_mem, launch.stream) == (
        "transpose", "grid", "block", "0", "stream")
    assert launch.args == ("d_in", "d_out", "int(rows)", "int(cols)")
    assert launch.bound_args(kernel)["out"] == "d_out"
    assert written_params(kernel) == {"out"} and read_params(kernel) == {"in"}


def test_multikernel_launches_the_three_kernels_eight_times_on_one_stream() -> None:
    model = suite("multikernel")
    assert [k.name for k in model.kernels] == ["poly_kernel", "oscillator_kernel", "combine_kernel"]
    sites = model.ops_in("enqueue_task")
    assert [op.kind for op in sites] == [HostOpKind.LAUNCH] * 3
    assert {op.launch.stream for op in sites if op.launch} == {"stream"}
    assert {(op.launch.grid, op.launch.block) for op in sites if op.launch} == {("kBlocks", "kThreads")}
    # main calls enqueue_task kTasks = 8 times, and the baseline makes no stream or event of its own.
    assert kinds(model, "main") == ["memcpy", "memset", "call", "memcpy"]
    call = model.ops_in("main")[2]
    assert (call.api, call.loops) == ("enqueue_task", (8,))
    assert not {HostOpKind.STREAM_CREATE, HostOpKind.EVENT_RECORD} & {op.kind for op in model.host_ops}


def test_multikernel_dependency_pair_write_and_read_sets() -> None:
    model = suite("multikernel")
    producer, consumer = model.kernel("poly_kernel"), model.kernel("combine_kernel")
    assert written_params(producer) == {"y"} and read_params(producer) == {"x"}
    assert written_params(consumer) == {"y"} and read_params(consumer) == {"x", "produced"}
    launch = next(op.launch for op in model.host_ops if op.launch and op.launch.kernel == "combine_kernel")
    assert launch.bound_args(consumer) == {"x": "xt", "produced": "y + (size_t)kProducer * n", "y": "yt", "n": "n"}


def test_multikernel_opt_forks_and_joins_streams_with_events() -> None:
    model = suite("multikernel_opt")
    ops = [(op.kind.value, op.stream, op.loops) for op in model.ops_in("main")]
    assert ops == [
        ("memcpy", None, ()), ("memset", None, ()), ("stream_create", None, (7,)),
        ("event_record", "stream", ()), ("stream_wait_event", "streams[s]", (7,)), ("call", None, (None,)),
        ("event_record", "streams[s]", (7,)), ("stream_wait_event", "stream", (7,)), ("memcpy", None, ()),
    ]


def test_unroll_pragma_with_a_constexpr_argument() -> None:
    kernel = suite("unroll").kernel("fir")
    staging, taps = kernel.loops
    assert staging.unroll is None and staging.trip_count is None
    assert taps.header == "for (int t = 0; t < taps; ++t)"
    assert (taps.variable, taps.trip_count, taps.trip_param) == ("t", None, None)
    assert taps.unroll is not None and (taps.unroll.argument, taps.unroll.value) == ("kUnroll", 1)
    assert taps.unroll.line == taps.span.start_line - 1
    assert suite("unroll", UNROLL=8).kernel("fir").loops[1].unroll.value == 8
    assert kernel.shared[0].dims == ("kBlock + kMaxTaps",) and kernel.shared[0].dim_values == (1280,)
    opt = suite("unroll_opt").kernel("fir")
    assert [(loop.trip_count, loop.depth, loop.unroll and loop.unroll.value) for loop in opt.loops] == [
        (None, 0, None), (None, 0, 4), (4, 1, None), (4, 2, None)]
    assert opt.shared[0].element_type == "float4" and opt.shared[0].dim_values == (512,)
    assert written_params(opt) == {"out"}  # reinterpret_cast<float4*>(out + base)[threadIdx.x] = ...


def test_regpressure_loops_have_trip_counts() -> None:
    kernel = suite("regpressure").kernel("series_sum")
    assert kernel.launch_bounds is None
    assert [(loop.variable, loop.trip_count, loop.depth, loop.unroll is not None) for loop in kernel.loops] == [
        ("k", 81, 0, True), ("s", None, 0, False), ("k", 80, 1, True)]
    opt = suite("regpressure_opt").kernel("series_sum")
    assert opt.launch_bounds is not None
    assert (opt.launch_bounds.max_threads, opt.launch_bounds.min_blocks, opt.launch_bounds.max_threads_value) == (
        "kBlock", "kBlocksPerSm", 256)
    assert [(loop.header, loop.variable, loop.trip_count) for loop in opt.loops] == [
        ("for (; s + 1 < steps; s += 2)", "s", None), ("for (int k = kTerms - 2; k >= 0; --k)", "k", 80)]


def test_matmul_tiles_and_the_unroll_param() -> None:
    kernel = suite("matmul").kernel("sgemm_tiled")
    assert [(s.name, s.dim_values) for s in kernel.shared] == [("a_tile", (16, 16)), ("b_tile", (16, 16))]
    assert [s.dim_values for s in suite("matmul", TILE=32).kernel("sgemm_tiled").shared] == [(32, 32)] * 2
    k_loop = next(loop for loop in kernel.loops if loop.variable == "k")
    assert (k_loop.trip_count, k_loop.depth, k_loop.unroll.argument) == (16, 1, "kUnroll")
    assert kernel.launch_bounds.max_threads_value == 256
    assert suite("matmul", WPT=4).kernel("sgemm_tiled").launch_bounds.max_threads_value == 64


def test_matmul_opt_aligned_tiles_and_writes_through_an_alias() -> None:
    model = suite("matmul_opt")
    kernel = model.kernel("sgemm_register_blocked")
    assert [(s.name, s.dims, s.dim_values) for s in kernel.shared] == [
        ("a_tile", ("kStepK", "kBlockTile"), (8, 128)), ("b_tile", ("kStepK", "kBlockTile"), (8, 128))]
    # float* dst = c + ...; *reinterpret_cast<float4*>(dst) = ...: c is written, though never named there.
    assert kernel.writes == {"c"} and kernel.may_write == frozenset()
    assert kernel.reads == {"a", "b"}  # through a_src / b_src, handed to load4 as const pointers
    b_store = next(a for a in kernel.shared[1].accesses if a.indices == ("b_row", "b_col"))
    assert b_store.is_write  # *reinterpret_cast<float4*>(&b_tile[b_row][b_col]) = b_next


def test_conv2d_loops_split_by_pragmas_keep_their_bodies() -> None:
    kernel = suite("conv2d").kernel("conv2d")
    assert [(loop.variable, loop.trip_count, loop.depth, loop.unroll is not None) for loop in kernel.loops] == [
        ("i", None, 0, False), ("t", 1, 0, True), ("ky", 7, 1, True), ("kx", 7, 2, True)]
    (halo,) = kernel.shared
    assert halo.dims == ("kHaloH", "kHaloW") and halo.dim_values == (14, 38)
    assert suite("conv2d", BLOCK_Y=16, TILE=2).kernel("conv2d").shared[0].dim_values == (38, 38)
    assert [a.indices for a in halo.accesses] == [("hy", "hx"), ("ty + ky", "threadIdx.x + kx")]
    opt = suite("conv2d_opt")
    to_symbol = next(op for op in opt.host_ops if op.api == "cudaMemcpyToSymbol")
    assert (to_symbol.dst, to_symbol.src, to_symbol.direction) == ("c_filter", "filter", "cudaMemcpyHostToDevice")


def test_saxpy_default_stream_launches_and_timing_events() -> None:
    model = suite("saxpy", ITEMS=4)
    assert kinds(model, "main") == ["memcpy", "memcpy", "memcpy", "launch", "device_sync", "event_record", "launch",
                                    "event_record", "event_sync", "memcpy"]
    first, timed = model.launches
    assert first.on_default_stream and timed.on_default_stream and first.stream is None
    assert (first.loops, timed.loops) == ((), (None,))  # --reps is a run-time count
    kernel = model.kernel("saxpy_poly")
    assert [loop.trip_count for loop in kernel.loops] == [None, 4, 4]
    assert written_params(kernel) == {"out"} and read_params(kernel) == {"x", "y"}


def test_harness_flush_kernel() -> None:
    model = analyze(HARNESS.read_text())
    kernel = model.kernel("wf_l2_flush")
    assert kernel.writes == {"sink"} and kernel.reads == {"data"}
    assert [(op.kind.value, op.api) for op in model.ops_in("bench")] == [
        ("call", "l2_flush_buffer"), ("call", "poison_outputs"), ("stream_sync", "cudaStreamSynchronize"),
        ("call", "poison_outputs"), ("launch", "wf_l2_flush"), ("event_record", "cudaEventRecord"),
        ("event_record", "cudaEventRecord"), ("event_sync", "cudaEventSynchronize")]  # poison: the guardrails' check


# -- synthetic sources ---------------------------------------------------------------------------

DECOYS = r"""
// fake<<<1, 1>>>(x); __shared__ float fake_tile[4];
/* ghost<<<2, 2>>>(y);
   __global__ void ghost(float* p) { p[0] = 1; } */
__global__ void real(float* p) {
  const char* text = "other<<<3, 3>>>(z); __shared__ int s[2];";
  const char raw[] = R"x(still<<<4, 4>>>() "quoted")x";
  p[0] = 1.0f;
}
void host(float* d) {
  real<<<1, 32>>>(d);  // and real<<<9, 9>>>(d) here
}
"""


def test_comments_and_strings_holding_cuda_syntax_are_not_code() -> None:
    model = analyze(DECOYS)
    assert [k.name for k in model.kernels] == ["real"]
    assert [(launch.kernel, launch.grid, launch.block, launch.line) for launch in model.launches] == [
        ("real", "1", "32", 11)]
    assert model.shared == () and model.errors == ()


CONDITIONALS = r"""
#define USE_FAST 1
#if 0
__global__ void dead(float* p) { p[0] = 0; }
#if 1
__global__ void dead_nested(float* p) { p[0] = 0; }
#endif
void launches_dead() { dead<<<1, 1>>>(nullptr); }
#elif USE_FAST
__global__ void fast(float* p) { p[0] = 1; }
#else
__global__ void slow(float* p) { p[0] = 2; }
#endif
#ifdef NOT_DEFINED
#define WIDTH 3
#else
#define WIDTH \
    (2 * USE_FAST + \
     2)
#endif
#if defined(WIDTH) && WIDTH > 3
__global__ void wide(float* p) {}
#endif
"""


def test_inactive_preprocessor_regions_are_skipped() -> None:
    model = analyze(CONDITIONALS)
    assert [k.name for k in model.kernels] == ["fast", "wide"]
    assert model.launches == () and model.errors == ()
    assert model.macros["WIDTH"] == "(2 * USE_FAST + 2)" and model.constants["WIDTH"] == 4
    assert [k.name for k in analyze(CONDITIONALS, defines={"USE_FAST": 0}).kernels] == ["slow"]
    assert [k.name for k in analyze(CONDITIONALS, defines={"NOT_DEFINED": 1}).kernels] == ["fast"]


TEMPLATES = r"""
constexpr int kTile = 16;
template <int BLOCK, typename T = float>
__global__ void __launch_bounds__(BLOCK) scale(const T* __restrict__ in, T* out, int n) {
  __shared__ T tile[kTile][kTile + 1];
#pragma unroll 4
  for (int i = 0; i < BLOCK; ++i) tile[threadIdx.x][i % kTile] = in[i];
  for (int s = 1; s < 1024; s <<= 1) {}
  for (int k = 2 * kTile; k >= 0; k -= 2) {}
  for (int m = 0; m != 12; m = m + 3) {}
  for (int q = 0; q < n; ++q) {}
  int j = 0;
  while (j < 10) { ++j; }
  do { --j; } while (j > 0);
  out[threadIdx.x] = tile[threadIdx.y][threadIdx.x];
}
template <class T> struct Wrap { using type = T; };
namespace ns { template <class T> __global__ void deep(T* p) { p[1] = 0; } }
void run(cudaStream_t s, float* d, int n) {
  scale<256, float><<<dim3(n / 256, 1), 256, 0, s>>>(d, d, n);
  ns::deep<Wrap<float>::type><<<(n + 255) >> 8, n > 0 ? 256 : 32>>>(d);
  auto later = [&](cudaStream_t t) { scale<128><<<1, 128, kTile * sizeof(float), t>>>(d, d, n); };
  void* args[] = {&d};
  cudaLaunchKernel((void*)&scale<64, float>, dim3(1), dim3(64), args, 0, s);
}
"""


def test_template_kernels_and_launch_forms() -> None:
    model = analyze(TEMPLATES)
    assert model.errors == ()
    kernel = model.kernel("scale")
    assert [(t.name, t.kind, t.type, t.default) for t in kernel.template_params] == [
        ("BLOCK", "value", "int", None), ("T", "type", None, "float")]
    assert kernel.launch_bounds is not None and kernel.launch_bounds.max_threads_value is None
    assert kernel.span.start_line == 3  # the template header belongs to the definition
    assert kernel.shared[0].dim_values == (16, 17) and kernel.shared[0].element_type == "T"
    launches = model.launches
    assert [(x.kernel, x.template_args, x.grid, x.block, x.shared_mem, x.stream, x.function) for x in launches] == [
        ("scale", "256, float", "dim3(n / 256, 1)", "256", "0", "s", "run"),
        ("deep", "Wrap<float>::type", "(n + 255) >> 8", "n > 0 ? 256 : 32", None, None, "run"),
        ("scale", "128", "1", "128", "kTile * sizeof(float)", "t", "run"),
        ("scale", None, "dim3(1)", "dim3(64)", "0", "s", "run"),
    ]
    assert model.launches[3].args == ("args",) and model.ops_in("run")[3].api == "cudaLaunchKernel"
    assert model.kernel("deep").writes == {"p"}


def test_loop_trip_counts_headers_and_template_dependence() -> None:
    loops = analyze(TEMPLATES).kernel("scale").loops
    facts = [(loop.kind, loop.variable, loop.trip_count, loop.trip_param) for loop in loops]
    assert facts == [("for", "i", None, "BLOCK"), ("for", "s", 10, None), ("for", "k", 17, None),
                     ("for", "m", 4, None), ("for", "q", None, None), ("while", None, None, None),
                     ("do", None, None, None)]
    assert loops[0].unroll is not None and (loops[0].unroll.argument, loops[0].unroll.value) == ("4", 4)
    assert all(loop.unroll is None for loop in loops[1:])
    assert loops[5].header == "while (j < 10)" and loops[6].header == "do ... while (j > 0)"


DYNAMIC_SHARED = r"""
extern __shared__ float file_dyn[];
__global__ void reduce(const float* in, float* out) {
  extern __shared__ __align__(16) unsigned char raw[];
  float* buf = reinterpret_cast<float*>(raw);
  file_dyn[threadIdx.x] = in[threadIdx.x];
  buf[threadIdx.x] = file_dyn[threadIdx.x ^ 1];
  if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}
void go(float* a, float* b, size_t bytes) { reduce<<<8, 256, bytes>>>(a, b); }
"""


def test_dynamic_shared_memory() -> None:
    model = analyze(DYNAMIC_SHARED)
    assert model.errors == ()
    (raw,) = model.kernel("reduce").shared
    assert (raw.name, raw.element_type, raw.dims, raw.dim_values, raw.is_dynamic) == (
        "raw", "unsigned char", ("",), (None,), True)
    file_dyn = next(s for s in model.shared if s.name == "file_dyn")
    assert file_dyn.kernel is None and file_dyn.is_dynamic
    assert [(a.kernel, a.indices, a.is_write) for a in file_dyn.accesses] == [
        ("reduce", ("threadIdx.x",), True), ("reduce", ("threadIdx.x ^ 1",), False)]
    assert model.launches[0].shared_mem == "bytes"


ALIASES = r"""
__device__ void helper(float* p);
__device__ float peek(const float* p);
__global__ void aliasing(float* out, float* other, const float* in, float* passed, int* count, float* untouched,
                         const float* ro_passed) {
  float* p = out + blockIdx.x * 4;
  p[threadIdx.x] = in[threadIdx.x];
  auto q = &other[3];
  float* r;
  r = q;
  *(r + 1) = 2.0f;
  atomicAdd(count, 1);
  helper(passed + 1);
  float v = peek(ro_passed) + untouched[0];
  out[0] += v;
}
"""


def test_writes_through_pointer_aliases_atomics_and_calls() -> None:
    kernel = analyze(ALIASES).kernel("aliasing")
    assert kernel.writes == {"out", "other", "count"}
    assert kernel.may_write == {"passed"}  # handed to helper, which this analysis cannot see
    assert written_params(kernel) == {"out", "other", "count", "passed"}
    assert read_params(kernel) == {"in", "count", "passed", "untouched", "ro_passed", "out"}  # out: +=
    assert "ro_passed" not in written_params(kernel)  # a const pointer handed to a call cannot be written


GRAMMAR_TRAPS = r"""
__global__ void traps(float* out, int n) {
  __shared__ __align__(16) float staged[64];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 8; ++b) out[a * 8 + b] = staged[a + b];
  auto twice = [=] __device__ (int v) { return 2 * v; };
  out[0] = twice(n);
}
void host(float* d, long cols) {
  const dim3 grid(unsigned(cols / 32), unsigned(cols % 32));
  traps<<<grid, 64>>>(d, int(cols));
}
"""


def test_constructs_the_grammar_misreads_are_handled() -> None:
    # tree-sitter alone errs on each: a pragma between a loop header and its body, __align__,
    # an extended __device__ lambda, and `unsigned(x)` in a constructor-style declaration.
    assert _ts.parser().parse(GRAMMAR_TRAPS.encode()).root_node.has_error
    model = analyze(GRAMMAR_TRAPS)
    assert model.errors == ()
    kernel = model.kernel("traps")
    assert [(loop.variable, loop.trip_count, loop.depth, loop.unroll is not None) for loop in kernel.loops] == [
        ("a", 4, 0, True), ("b", 8, 1, True)]
    assert kernel.shared[0].dim_values == (64,)
    assert model.launches[0].grid == "grid" and model.launches[0].args == ("d", "int(cols)")


def test_syntax_errors_give_partial_results_and_errors() -> None:
    broken = DECOYS + "\nvoid broken( { int x = ; }\n" + DYNAMIC_SHARED
    model = analyze(broken)
    assert model.errors and all(issue.line >= 13 for issue in model.errors)
    assert {k.name for k in model.kernels} >= {"real", "reduce"}
    assert "reduce" in {launch.kernel for launch in model.launches}


@pytest.mark.parametrize("path", SUITE, ids=lambda p: p.name)
def test_damaged_sources_never_raise(path: Path) -> None:
    source = path.read_text()
    rng = random.Random(path.name)
    variants = [source[:cut] for cut in range(0, len(source), max(1, len(source) // 20))]
    for _ in range(15):
        start = rng.randrange(len(source))
        variants.append(source[:start] + source[start + rng.randrange(1, 300) :])
        junk = rng.choice(["<<<", "#if 0\n", "/*", '"', "{", "}", "\\\n", "é"])
        variants.append(source[:start] + junk + source[start:])
    for variant in variants:
        assert isinstance(analyze(variant), SourceModel)


def test_spans_index_the_str_even_with_multibyte_characters() -> None:
    source = "// Größe: ∑ über alle Kacheln\n" + DYNAMIC_SHARED
    model = analyze(source)
    kernel: Kernel = model.kernel("reduce")
    assert source[kernel.span.start : kernel.span.end].startswith("__global__ void reduce(")
    assert source[kernel.body.end - 1] == "}"
    (raw,) = kernel.shared
    assert source[raw.span.start : raw.span.end] == "extern __shared__ __align__(16) unsigned char raw[];"


HOST_OPS = r"""
__global__ void k(float* p) { p[threadIdx.x] = 0; }
static void stage(float* d, const float* h, size_t bytes, cudaStream_t s) {
  cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s);
}
int main() {
  float *d, *h; size_t bytes = 1024; cudaStream_t s; cudaEvent_t e;
  cudaStreamCreate(&s);
  cudaMemset(d, 0, bytes);
  for (int i = 0; i < 3; ++i) stage(d, h, bytes, s);
  k<<<4, 256, 0, s>>>(d);
  cudaEventRecord(e, s);
  cudaStreamWaitEvent(0, e, 0);
  cudaStreamSynchronize(s); cudaEventSynchronize(e); cudaDeviceSynchronize();
  cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
}
"""


def test_host_operations_in_order_with_their_operands() -> None:
    model = analyze(HOST_OPS)
    assert kinds(model, "main") == ["stream_create", "memset", "call", "launch", "event_record", "stream_wait_event",
                                    "stream_sync", "event_sync", "device_sync", "memcpy"]
    (copy_in,) = model.ops_in("stage")
    assert (copy_in.dst, copy_in.src, copy_in.direction, copy_in.stream) == ("d", "h", "cudaMemcpyHostToDevice", "s")
    main = model.ops_in("main")
    assert main[2].loops == (3,) and main[3].stream == "s" and not main[3].launch.on_default_stream
    assert (main[4].stream, main[5].stream, main[6].stream) == ("s", "0", "s")
    assert (main[-1].dst, main[-1].src, main[-1].direction) == ("h", "d", "cudaMemcpyDeviceToHost")


CONSTANTS = r"""
#define HEX 0x1F
#define OCT 010
#define LOOP_A LOOP_B
#define LOOP_B LOOP_A
constexpr int kNeg = -7 / 2, kMod = -7 % 3, kShift = 1 << 10 | 3, kBits = 0b101 ^ 1'000;
constexpr long long kBig = 4096ULL * (HEX > 16 ? OCT : 1);
constexpr int kCasts = int(kShift / 2) + static_cast<int>(2) + (unsigned)1 + unsigned(3);
constexpr float kHalf = 0.5f;
constexpr int kSize = sizeof(float);
static const int kAlsoConst = kNeg + 1;
int not_constant = 5;
"""


def test_constant_expressions_evaluate_as_in_cpp() -> None:
    constants = analyze(CONSTANTS).constants
    assert (constants["HEX"], constants["OCT"]) == (31, 8)
    assert (constants["kNeg"], constants["kMod"], constants["kShift"], constants["kBits"]) == (-3, -1, 1027, 1005)
    assert constants["kBig"] == 4096 * 8 and constants["kAlsoConst"] == -2
    assert constants["kCasts"] == 513 + 2 + 1 + 3
    assert not {"LOOP_A", "LOOP_B", "kHalf", "kSize", "not_constant"} & set(constants)


PRAGMAS = r"""
__global__ void marked(float* out, int n) {
#pragma unroll 2
  // a comment between the pragma and its loop
  for (int i = 0; i < 8; ++i) out[i] = 0;
#pragma unroll
  if (n) for (int j = 0; j < 4; ++j) out[j] = 1;
#pragma unroll 3
  out[0] = 2;
  for (int k = 0; k < 4; ++k) out[k] = 3;
}
"""


def test_an_unroll_pragma_belongs_only_to_the_loop_right_below_it() -> None:
    loops = analyze(PRAGMAS).kernel("marked").loops
    assert [(loop.variable, loop.unroll and loop.unroll.argument) for loop in loops] == [
        ("i", "2"), ("j", None), ("k", None)]


def test_generated_deeply_nested_expressions_do_not_exhaust_the_stack() -> None:
    terms = " + ".join(["1"] * 3000)
    source = (f"constexpr int kDeep = {terms};\n"
              f"__global__ void deep(float* out, int n) {{ float* p = out + {terms}; p[0] = n; }}\n")
    model = analyze(source)
    assert model.kernel("deep").writes == {"out"}
    assert "kDeep" not in model.constants  # too deep to evaluate: unknown, not an error
