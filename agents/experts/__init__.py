"""Rule-based experts: agents that read a target's analysis (ptxas resources, source structure,
profile metrics) and propose variants or search parameters for the sweep to measure."""

from agents.experts.padding import PaddingExpert
from agents.experts.registers import RegisterExpert
from agents.experts.streamify import StreamifyExpert
from agents.experts.unroll import UnrollExpert

__all__ = ["PaddingExpert", "RegisterExpert", "StreamifyExpert", "UnrollExpert"]
