"""No secret reaches the run directory: a sweep started with API keys in its environment, whose
candidates dump their whole environment into the results, leaves no trace of them in any file."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO, repo_pythonpath, write_config, write_target

ENV_DUMP_C = r"""
#include <stdio.h>
extern char **environ;
int main(void) {
    FILE *f = fopen("out.bin", "wb");
    float v = 1.0f;
    fwrite(&v, sizeof v, 1, f);
    fclose(f);
#if LEAK
    for (char **e = environ; *e; e++) fprintf(stderr, "%s\n", *e);  /* into the row's error tail */
    return 1;
#else
    printf("@warpfleet time_ms=1\n");
    return 0;
#endif
}
"""

SECRETS = {"OPENAI_API_KEY": "sk-warpfleet-test-0123456789abcdef",
           "HF_TOKEN": "hf_warpfleettesttoken0123456789",
           "DB_PASSWORD": "warpfleet-test-password-42"}


def test_no_secret_in_any_file_a_sweep_writes(tmp_path):
    one_flag = REPO / "tests" / "fixtures" / "targets" / "poison" / "space.yaml"
    target = write_target(tmp_path / "t", params={"LEAK": [0, 1]}, space=str(one_flag))
    (target.parent / "tiny.c").write_text(ENV_DUMP_C)
    config = write_config(tmp_path, ["t/target.yaml"], search={"sampler": "grid", "trials": 2},
                          measure={"final_top_k": 1, "final_runs": 1})
    env = {**os.environ, **SECRETS, "PYTHONPATH": repo_pythonpath()}
    result = subprocess.run([sys.executable, "-m", "cluster.cli", "sweep", str(config), "--no-progress"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = next((tmp_path / "runs").iterdir())
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files)
    from cluster.store.results import read_results

    rows = read_results(run_dir)
    leaked = rows.loc[rows["p_LEAK"] == 1, "error_tail"].iloc[0]
    assert "PATH=" in leaked  # the candidate did dump its environment into the results
    for path in files:
        content = path.read_bytes()
        for name, value in SECRETS.items():
            assert value.encode() not in content, f"{name} written to {path}"
    for name, value in SECRETS.items():
        assert value not in result.stdout + result.stderr, f"{name} printed"
