"""Agents that propose source transformations: the contract, the patch tools with their
read-only guards, and the CUDA source analysis that expert agents build on."""

from agents._base import Agent, AnalysisContext, Proposal
from agents.patch import Patched, Refused, Variant, apply, readonly_regions, variant_bundle

__all__ = ["Agent", "AnalysisContext", "Patched", "Proposal", "Refused", "Variant", "apply", "readonly_regions",
           "variant_bundle"]
