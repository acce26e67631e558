"""The engine: where the agents and the run time meet. Its floors, bottom first (each imports only
those below it; tests/cluster/core/test_layering.py holds them to it):

    scheduling/    jobs, their lanes and queues per device type, the Ray workers that serve them
    plan/          the time budget: what each study still needs, when its search stops or reopens
    study/         one study's Optuna state, the jobs it makes, what the sweep's flows share
    verification/  the tiers of checks (admission, compute-sanitizer, cheat checks, reviews) and
                   the gate that says what may be a final
    (this folder)  each study's flow (baseline, search, finals, profiles), the agents' stage, the
                   driver's loop, cross-evaluation and the progress display
"""
