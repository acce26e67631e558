"""Rule-based experts: agents that read a target's analysis (ptxas resources, source structure,
profile metrics) and propose variants or search parameters for the sweep to measure."""

from agents.experts.constant import ConstantExpert
from agents.experts.launch_bounds import LaunchBoundsExpert
from agents.experts.padding import PaddingExpert
from agents.experts.registers import RegisterExpert
from agents.experts.restrict import RestrictExpert
from agents.experts.shared_stage import SharedStageExpert
from agents.experts.streamify import StreamifyExpert
from agents.experts.unroll import UnrollExpert
from agents.experts.vectorize import VectorizeExpert

__all__ = ["ConstantExpert", "LaunchBoundsExpert", "PaddingExpert", "RegisterExpert", "RestrictExpert",
           "SharedStageExpert", "StreamifyExpert", "UnrollExpert", "VectorizeExpert"]
