"""The Nsight Compute stage's parsing (the real ncu runs in the GPU tests)."""

from cluster.config import ProfileSpec, load_target
from cluster.core.types import Candidate, Status
from cluster.measure.profile import (
    DEFAULT_METRICS,
    LaunchFilter,
    Profile,
    ncu_command,
    parse_ncu_csv,
    profile_candidate,
    top_stalls,
)
from cluster.runners._base import Invocation, ProcessRunner, Staged
from cluster.sandbox.sandbox import ProcessResult
from tests.conftest import write_target

NCU_OUTPUT = '''==PROF== Connected to process 4242 (/tmp/run/candidate.bin)
@warpfleet time_ms=0.2
==PROF== Profiling "wf_l2_flush" - 0: 0%....50%....100% - 9 passes
==PROF== Profiling "transpose" - 1: 0%....50%....100% - 9 passes
@warpfleet samples=1 median_ms=0.2 noise=0 converged=0 region_start_unix=1.0 region_end_unix=2.0
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","candidate.bin","127.0.0.1","wf_l2_flush(const float *, unsigned long, float *)","1","7","(256, 1, 1)","(1320, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","41.09"
"1","4242","candidate.bin","127.0.0.1","void transpose<32>(float *, const float *, int)","1","7","(32, 8, 1)","(256, 256, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","335.10"
"1","4242","candidate.bin","127.0.0.1","void transpose<32>(float *, const float *, int)","1","7","(32, 8, 1)","(256, 256, 1)","0","9.0","Command line profiler metrics","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum","","65,011,712"
"1","4242","candidate.bin","127.0.0.1","void transpose<32>(float *, const float *, int)","1","7","(32, 8, 1)","(256, 256, 1)","0","9.0","Command line profiler metrics","sm__maximum_warps_per_active_cycle_pct","%","100"
"1","4242","candidate.bin","127.0.0.1","void transpose<32>(float *, const float *, int)","1","7","(32, 8, 1)","(256, 256, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio","","7.5"
"1","4242","candidate.bin","127.0.0.1","void transpose<32>(float *, const float *, int)","1","7","(32, 8, 1)","(256, 256, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","","2.25"
"1","4242","candidate.bin","127.0.0.1","void transpose<32>(float *, const float *, int)","1","7","(32, 8, 1)","(256, 256, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","","n/a"
'''  # noqa: E501 - ncu's CSV lines as printed


def test_parse_keeps_kernels_drops_the_flush_and_reads_grouped_numbers():
    values = parse_ncu_csv(NCU_OUTPUT)
    assert {v.kernel for v in values} == {"void transpose<32>(float *, const float *, int)"}
    by_metric = {v.metric: v.value for v in values}
    assert by_metric["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"] == 65_011_712
    assert by_metric["gpu__time_duration.sum"] == 335.10
    assert by_metric["smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"] is None
    assert all(v.launch == 1 for v in values)


def test_top_stalls_and_empty_output():
    profile = Profile("k", Status.OK, tuple(parse_ncu_csv(NCU_OUTPUT)))
    assert top_stalls(profile, 2) == [("mio_throttle", 7.5), ("long_scoreboard", 2.25)]
    assert parse_ncu_csv("no profiler output at all\n") == []


def test_command_pins_clock_control_off_and_is_an_argument_list():
    argv = ncu_command(["/x/candidate.bin", "--seed", "0"], DEFAULT_METRICS[:2])
    assert argv[:4] == ["ncu", "--csv", "--clock-control", "none"]
    assert argv[-3:] == ["/x/candidate.bin", "--seed", "0"]
    assert argv[argv.index("--metrics") + 1] == ",".join(DEFAULT_METRICS[:2])


def test_command_bounds_the_launches_profiled_per_launch_configuration():
    argv = ncu_command(["/x/candidate.bin"], DEFAULT_METRICS[:1])
    assert argv[argv.index("--filter-mode") + 1] == "per-launch-config"
    assert argv[argv.index("--launch-count") + 1] == "1" and argv[argv.index("--launch-skip") + 1] == "0"
    assert argv.index("--launch-count") < argv.index("--metrics") < argv.index("/x/candidate.bin")
    warmed = ncu_command(["/x/candidate.bin"], DEFAULT_METRICS[:1], LaunchFilter(count=3, skip=2, per_config=False))
    assert "--filter-mode" not in warmed
    assert warmed[warmed.index("--launch-skip") + 1] == "2" and warmed[warmed.index("--launch-count") + 1] == "3"
    every = ncu_command(["/x/candidate.bin"], DEFAULT_METRICS[:1], LaunchFilter(count=None))
    assert not {"--launch-count", "--launch-skip", "--filter-mode"} & set(every)


def test_default_metrics_give_sectors_per_request_and_the_l1_hit_rate():
    for op in ("ld", "st"):
        assert f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum" in DEFAULT_METRICS
        assert f"l1tex__t_requests_pipe_lsu_mem_global_op_{op}.sum" in DEFAULT_METRICS
    assert {"l1tex__t_sector_hit_rate.pct", "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum.per_second"} <= set(
        DEFAULT_METRICS)
    assert len(set(DEFAULT_METRICS)) == len(DEFAULT_METRICS)


class ScriptedRunner(ProcessRunner):
    """Starts nothing: answers every run with NCU_OUTPUT and keeps the argv it would have run."""

    def __init__(self) -> None:
        super().__init__()
        self.argv: list[list[str]] = []

    def execute(self, staged: Staged, invocation: Invocation) -> ProcessResult:
        self.argv.append(staged.argv(invocation))
        return ProcessResult(0, NCU_OUTPUT, "", 0.1)


def test_profile_candidate_bounds_the_launches_as_the_run_config_says(tmp_path):
    target = load_target(write_target(tmp_path))
    candidate = Candidate(target.name, "cc", "host", "host", target.bundle.hash, (), ())
    runner = ScriptedRunner()
    default = LaunchFilter(ProfileSpec().launches)  # as the workers build it from the run config
    assert profile_candidate(target, candidate, b"", DEFAULT_METRICS[:1], 60, runner, default).status is Status.OK
    profile_candidate(target, candidate, b"", DEFAULT_METRICS[:1], 60, runner, LaunchFilter(None))
    bounded, every = runner.argv
    assert bounded[bounded.index("--launch-count") + 1] == "1" and bounded[-1].endswith("candidate.bin")
    assert bounded.index("--launch-count") < bounded.index("--metrics")
    assert "--launch-count" not in every and every[-1].endswith("candidate.bin")
