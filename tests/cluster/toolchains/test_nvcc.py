"""Nvcc: arch naming and the ptxas resource report, on reports captured from nvcc 13.0."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from cluster.core.placeholders import expand
from cluster.core.types import DeviceInfo, KernelResources
from cluster.toolchains import Nvcc

# The reports below were captured from nvcc 13.0 (V13.0.88) compiling, with -c, a file holding
#   __device__ __noinline__ float helper(float x, int n)    (a device function, kept out of line)
#   __global__ void transpose(const float*, float*, int)    (__shared__ float tile[32][33])
#   template <typename T, int N> __global__ void scale(T* data, T factor)   (calls helper)
#   template __global__ void scale<float, 256>(float*, float);
#   __global__ void pressure(const float*, float*)          (48 floats live, reads __constant__)
PRESSURE, SCALE, TRANSPOSE, HELPER = (
    "_Z8pressurePKfPf", "_Z5scaleIfLi256EEvPT_S0_", "_Z9transposePKfPfi", "_Z6helperfi",
)  # fmt: skip

# nvcc --resource-usage -arch=sm_80 -maxrregcount=16
SM80_CAPPED = """\
ptxas warning : For profile sm_80 adjusting per thread register count of 16 to lower bound of 24
ptxas info    : Overriding maximum register limit 256 for '_Z8pressurePKfPf' with  24 of maxrregcount option
ptxas info    : Overriding maximum register limit 256 for '_Z5scaleIfLi256EEvPT_S0_' with  24 of maxrregcount option
ptxas info    : Overriding maximum register limit 256 for '_Z9transposePKfPfi' with  24 of maxrregcount option
ptxas info    : 24 bytes gmem, 256 bytes cmem[3], 8 bytes cmem[4]
ptxas info    : Compiling entry function '_Z8pressurePKfPf' for 'sm_80'
ptxas info    : Function properties for _Z8pressurePKfPf
    416 bytes stack frame, 444 bytes spill stores, 556 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 416 bytes cumulative stack size, 368 bytes cmem[0]
ptxas info    : Compile time = 11.873 ms
ptxas info    : Compiling entry function '_Z5scaleIfLi256EEvPT_S0_' for 'sm_80'
ptxas info    : Function properties for _Z5scaleIfLi256EEvPT_S0_
    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 32 bytes cumulative stack size, 364 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Compile time = 10.744 ms
ptxas info    : Function properties for _Z6helperfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z9transposePKfPfi' for 'sm_80'
ptxas info    : Function properties for _Z9transposePKfPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 4224 bytes smem, 372 bytes cmem[0]
ptxas info    : Compile time = 1.238 ms
"""

# nvcc --resource-usage -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
SM80_AND_SM90 = """\
ptxas info    : 24 bytes gmem, 256 bytes cmem[3], 8 bytes cmem[4]
ptxas info    : Compiling entry function '_Z8pressurePKfPf' for 'sm_80'
ptxas info    : Function properties for _Z8pressurePKfPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 80 registers, used 0 barriers, 368 bytes cmem[0]
ptxas info    : Compile time = 8.256 ms
ptxas info    : Compiling entry function '_Z5scaleIfLi256EEvPT_S0_' for 'sm_80'
ptxas info    : Function properties for _Z5scaleIfLi256EEvPT_S0_
    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 22 registers, used 0 barriers, 32 bytes cumulative stack size, 364 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Compile time = 10.423 ms
ptxas info    : Function properties for _Z6helperfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z9transposePKfPfi' for 'sm_80'
ptxas info    : Function properties for _Z9transposePKfPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 4224 bytes smem, 372 bytes cmem[0]
ptxas info    : Compile time = 1.337 ms
ptxas info    : 24 bytes gmem
ptxas info    : Compiling entry function '_Z8pressurePKfPf' for 'sm_90'
ptxas info    : Function properties for _Z8pressurePKfPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 72 registers, used 0 barriers
ptxas info    : Compile time = 10.472 ms
ptxas info    : Compiling entry function '_Z5scaleIfLi256EEvPT_S0_' for 'sm_90'
ptxas info    : Function properties for _Z5scaleIfLi256EEvPT_S0_
    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 22 registers, used 0 barriers, 32 bytes cumulative stack size
ptxas info    : Compile time = 12.487 ms
ptxas info    : Function properties for _Z6helperfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z9transposePKfPfi' for 'sm_90'
ptxas info    : Function properties for _Z9transposePKfPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 4224 bytes smem
ptxas info    : Compile time = 1.760 ms
"""

# nvcc -Xptxas -v -rdc=true -arch=sm_90: the device function now has a frame of its own.
SM90_RDC_PTXAS = """\
ptxas info    : 24 bytes gmem
ptxas info    : Compiling entry function '_Z8pressurePKfPf' for 'sm_90'
ptxas info    : Function properties for _Z8pressurePKfPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 72 registers, used 0 barriers
ptxas info    : Compile time = 11.421 ms
ptxas info    : Function properties for _Z6helperfi
    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compile time = 5.663 ms
ptxas info    : Compiling entry function '_Z5scaleIfLi256EEvPT_S0_' for 'sm_90'
ptxas info    : Function properties for _Z5scaleIfLi256EEvPT_S0_
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers
ptxas info    : Compile time = 1.501 ms
ptxas info    : Compiling entry function '_Z9transposePKfPfi' for 'sm_90'
ptxas info    : Function properties for _Z9transposePKfPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 1 barriers, 4224 bytes smem
ptxas info    : Compile time = 1.713 ms
"""

# nvcc --resource-usage -rdc=true -arch=sm_90 (compile and link): nvlink reports, not ptxas.
SM90_RDC_NVLINK = """\
nvlink info    : 24 bytes gmem, 256 bytes cmem[3]
nvlink info    : Function properties for '_Z9transposePKfPfi':
nvlink info    : used 14 registers, used 1 barriers, 0 stack, 5248 bytes smem, 548 bytes cmem[0], 0 bytes lmem
nvlink info    : Function properties for '_Z8pressurePKfPf':
nvlink info    : used 72 registers, used 0 barriers, 0 stack, 0 bytes smem, 544 bytes cmem[0], 0 bytes lmem
nvlink info    : Function properties for '_Z5scaleIfLi256EEvPT_S0_':
nvlink info    : used 45 registers, used 0 barriers, 32 stack, 0 bytes smem, 540 bytes cmem[0], 0 bytes lmem
"""


def gpu(compute_capability: str) -> DeviceInfo:
    return DeviceInfo(kind="gpu", name="NVIDIA Test", arch="", compute_capability=compute_capability)


@pytest.mark.parametrize(
    ("compute_capability", "arch"), [("9.0", "sm_90"), ("8.0", "sm_80"), ("8.6", "sm_86"), ("12.0", "sm_120")]
)
def test_arch_is_sm_and_the_compute_capability_digits(compute_capability: str, arch: str) -> None:
    assert Nvcc().arch_for(gpu(compute_capability)) == arch


@pytest.mark.parametrize("compute_capability", ["", "host", "9"])
def test_a_device_without_a_compute_capability_has_no_arch(compute_capability: str) -> None:
    with pytest.raises(ValueError, match="compute capability"):
        Nvcc().arch_for(gpu(compute_capability))


def test_every_kernel_of_a_report_is_read_with_its_spills() -> None:
    assert Nvcc().parse_resources(SM80_CAPPED) == (
        KernelResources(PRESSURE, "sm_80", registers=24, spill_stores=444, spill_loads=556,
                        stack_bytes=416, constant_bytes=368),
        KernelResources(SCALE, "sm_80", registers=24, stack_bytes=32, constant_bytes=364),
        KernelResources(TRANSPOSE, "sm_80", registers=10, shared_bytes=4224, constant_bytes=372),
    )  # fmt: skip


def test_a_report_for_two_archs_gives_each_kernel_once_per_arch() -> None:
    kernels = Nvcc().parse_resources(SM80_AND_SM90)
    assert [(k.kernel, k.arch) for k in kernels] == [
        (name, arch) for arch in ("sm_80", "sm_90") for name in (PRESSURE, SCALE, TRANSPOSE)
    ]
    by_arch = {(k.kernel, k.arch): k for k in kernels}
    assert by_arch[PRESSURE, "sm_80"].registers == 80 and by_arch[PRESSURE, "sm_90"].registers == 72
    assert by_arch[TRANSPOSE, "sm_90"] == KernelResources(TRANSPOSE, "sm_90", registers=12, shared_bytes=4224)


def test_a_device_functions_figures_go_to_no_kernel() -> None:
    kernels = Nvcc().parse_resources(SM90_RDC_PTXAS)
    assert HELPER not in {k.kernel for k in kernels}
    # helper's 32-byte frame sits between pressure's report and scale's: neither may take it.
    assert {k.kernel: k.stack_bytes for k in kernels} == {PRESSURE: 0, SCALE: 0, TRANSPOSE: 0}
    assert {k.kernel: k.registers for k in kernels} == {PRESSURE: 72, SCALE: 24, TRANSPOSE: 14}


def test_the_linkers_report_under_rdc_is_read_without_an_arch() -> None:
    assert Nvcc().parse_resources(SM90_RDC_NVLINK) == (
        KernelResources(TRANSPOSE, "", registers=14, shared_bytes=5248, constant_bytes=548),
        KernelResources(PRESSURE, "", registers=72, constant_bytes=544),
        KernelResources(SCALE, "", registers=45, stack_bytes=32, constant_bytes=540),
    )


def test_the_older_report_layout_is_read() -> None:
    # CUDA 11/12 layout: no barrier count, and some builds prefix the frame line with "ptxas .".
    report = (
        "ptxas info    : Compiling entry function 'stencil' for 'sm_86'\r\n"
        "ptxas info    : Function properties for stencil\r\n"
        "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\r\n"
        "ptxas info    : Used 32 registers, 4096 bytes smem, 360 bytes cmem[0]\r\n"
    )
    assert Nvcc().parse_resources(report) == (
        KernelResources("stencil", "sm_86", registers=32, spill_stores=8, spill_loads=12,
                        shared_bytes=4096, stack_bytes=16, constant_bytes=360),
    )  # fmt: skip


@pytest.mark.parametrize(
    "output",
    [
        "",
        "nvcc fatal   : Unsupported gpu architecture 'compute_10'",
        'k.cu(3): error: identifier "tile" is undefined\n1 error detected in the compilation of "k.cu".',
        # figures with no kernel named before them
        "ptxas info    : Used 99 registers, 4224 bytes smem\n    8 bytes stack frame, 4 bytes spill stores",
        "ptxas info    : Function properties for\nptxas info    : Compiling entry function ''\n\x00\ufffd",
    ],
)
def test_output_without_a_readable_kernel_gives_none_and_never_raises(output: str) -> None:
    assert Nvcc().parse_resources(output) == ()


def test_a_truncated_report_keeps_what_it_has() -> None:
    cut = SM80_CAPPED[: SM80_CAPPED.index("ptxas info    : Compiling entry function '_Z9transpose")]
    cut += "ptxas info    : Compiling entry function '_Z9transposePKfPfi' for 'sm_80'\nptxas info    : Used 1"
    kernels = Nvcc().parse_resources(cut)
    assert [k.kernel for k in kernels] == [PRESSURE, SCALE, TRANSPOSE]
    assert kernels[0].spill_stores == 444
    assert kernels[2] == KernelResources(TRANSPOSE, "sm_80")  # a line cut short is not half-read


# --- real compiles: three nvcc invocations in all, run side by side --------------------------

nvcc_on_path = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

TEST_SOURCE = """\
__global__ void transpose(const float* in, float* out, int n) {
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x, y = blockIdx.y * TILE + threadIdx.y;
    if (x < n && y < n) tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x;
    y = blockIdx.x * TILE + threadIdx.y;
    if (x < n && y < n) out[y * n + x] = tile[threadIdx.x][threadIdx.y];
}

// 48 values live at once: fits in registers unless the register count is capped.
__global__ void pressure(const float* in, float* out) {
    float r[48];
    int t = threadIdx.x;
#pragma unroll
    for (int i = 0; i < 48; ++i) r[i] = in[t + i * 1024];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 48; ++i) s += r[i] * r[47 - i];
#pragma unroll
    for (int i = 0; i < 48; ++i) out[t + i * 1024] = r[i] * s + r[(i + 7) % 48];
}

int main() { return 0; }
"""
BUILDS = {"sm_80": ("sm_80", []), "sm_90": ("sm_90", []), "sm_90_capped": ("sm_90", ["-maxrregcount=16"])}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[KernelResources, ...]]:
    """Each build of TEST_SOURCE through Nvcc's default build, parsed from nvcc's stderr."""
    folder = tmp_path_factory.mktemp("nvcc")
    source = folder / "kernels.cu"
    source.write_text(TEST_SOURCE)
    running: dict[str, subprocess.Popen[str]] = {}
    for build, (arch, extra_flags) in BUILDS.items():
        argv = expand(Nvcc.default_build, {
            "flags": [*Nvcc.report_flags, *extra_flags], "defines": ["-DTILE=32"],
            "arch": arch, "binary": str(folder / build), "sources": [str(source)],
        })  # fmt: skip
        running[build] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parsed: dict[str, tuple[KernelResources, ...]] = {}
    for build, process in running.items():
        _, stderr = process.communicate(timeout=240)
        assert process.returncode == 0, stderr
        assert (folder / build).is_file()
        parsed[build] = Nvcc().parse_resources(stderr)
    return parsed


def kernel(kernels: tuple[KernelResources, ...], name: str) -> KernelResources:
    [found] = [k for k in kernels if k.kernel == name]
    return found


@pytest.mark.nvcc
@nvcc_on_path
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_a_real_report_gives_the_declared_shared_memory(
    reports: dict[str, tuple[KernelResources, ...]], arch: str
) -> None:
    transpose = kernel(reports[arch], TRANSPOSE)
    assert transpose.arch == arch
    assert transpose.registers > 0
    assert transpose.shared_bytes == 32 * 33 * 4  # tile[TILE][TILE + 1] floats, TILE=32
    assert {k.arch for k in reports[arch]} == {arch}


@pytest.mark.nvcc
@nvcc_on_path
def test_a_register_cap_shows_as_spills(reports: dict[str, tuple[KernelResources, ...]]) -> None:
    free, capped = kernel(reports["sm_90"], PRESSURE), kernel(reports["sm_90_capped"], PRESSURE)
    assert free.spill_stores == 0 and free.spill_loads == 0
    assert capped.spill_stores > 0 and capped.spill_loads > 0
    assert capped.registers < free.registers


def test_the_default_build_optimizes_host_code_too() -> None:
    """nvcc hands its -O to the host compiler, which defaults to -O0; ptxas optimizes device code
    at -O3 by default, and the space's `-Xptxas -O` flags after it still decide for the device."""
    argv = expand(Nvcc.default_build, {"flags": ["-Xptxas", "-O1"], "defines": [], "arch": "sm_90",
                                       "binary": "b", "sources": ["k.cu"]})
    assert argv[:4] == ["nvcc", "-O3", "-Xptxas", "-O1"]
