"""warpfleet against Kernel Tuner on the same kernels, spaces and GPUs (issue 8).

    spaces.py     each kernel defined once: params, constraints, launch geometry, inputs, check;
                  Kernel Tuner's tune_kernel arguments and warpfleet's target are derived from it
    reference.py  the independent timer (nvcc cubins run through CuPy, CUDA events, L2 flush)
    kt_run.py     one Kernel Tuner tuning run, as an evaluation trace
    wf_run.py     one warpfleet sweep, as an evaluation trace
    lanes.py      a lane process: a list of blocks run on the GPUs it was given, a part file each
    analysis.py   the figures (time to within 1%, winner stability, scaling) from the part files
    report.py     the markdown table

The entry point is scripts/bench_kerneltuner.py.
"""
