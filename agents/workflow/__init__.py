"""The WarpDrive workflow: typed step contracts and the loop that runs them."""

from agents.workflow.engine import Outcome, proposal_key, run_workflow
from agents.workflow.steps import (
    Analyst,
    Finding,
    Level,
    Plan,
    Planner,
    Steps,
    Transformer,
    Verdict,
    VerdictStatus,
    Verification,
    Verifier,
)

__all__ = ["Analyst", "Finding", "Level", "Outcome", "Plan", "Planner", "Steps", "Transformer", "Verdict",
           "VerdictStatus", "Verification", "Verifier", "proposal_key", "run_workflow"]
