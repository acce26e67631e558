"""The store: a run directory (``RunDir`` owns every path in it), the Parquet tables and their
schemas, the baselines' reference outputs and the agents' variants."""
