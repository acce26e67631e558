"""One study per (target, device type): its Optuna state and results (``state``), the jobs it makes
(``study_jobs``), and what the flows of one sweep share (``context``)."""
