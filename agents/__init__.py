"""Agents that propose source transformations (filled by later work; the contract is here)."""

from agents._base import Agent, AnalysisContext, Proposal

__all__ = ["Agent", "AnalysisContext", "Proposal"]
