"""LLM agents for every step of the workflow, through any OpenAI-compatible endpoint.

    AgentsConfig ─► make_kit (OpenAIChat | ReplayChat, ExchangeStore, TokenBudget, Prompts, Services)
                 ─► build_steps ─► [Steps]: experts and LLMAnalyst/LLMPlanner/LLMTransformer per step
                 ─► agents.workflow.run_workflow, or iterate (profile-guided rounds)
    every exchange ─► <run_dir>/llm/ (content-addressed, replayable); every proposal ─► usage_record

``FakeOpenAIServer`` is the scripted endpoint for tests and dry runs.
"""

from agents.llm.accounting import LLMProposal, TokenBudget, Usage, usage_record
from agents.llm.client import ChatClient, ChatRequest, Completion, EndpointError, OpenAIChat
from agents.llm.config import AgentsConfig, CustomSpec, LLMSpec, Prices, StepChoice
from agents.llm.custom import custom_steps, load_custom
from agents.llm.fake_server import Attempts, Conversation, Fail, FakeOpenAIServer, Reply, Stall, ToolCall, call
from agents.llm.guard import Workspace, check_files
from agents.llm.iterate import IterationResult, Round, Trial, feedback_text, iterate, trial_record
from agents.llm.kit import build_steps, make_kit, steps_from_config
from agents.llm.prompts import Prompts
from agents.llm.steps import Kit, LLMAnalyst, LLMPlanner, LLMReviewer, LLMStepError, LLMTransformer
from agents.llm.store import ExchangeStore, ReplayChat
from agents.llm.tools import Services, local_build

__all__ = [
    "AgentsConfig", "Attempts", "ChatClient", "ChatRequest", "Completion", "Conversation", "CustomSpec",
    "EndpointError", "ExchangeStore", "Fail", "FakeOpenAIServer", "IterationResult", "Kit", "LLMAnalyst",
    "LLMPlanner", "LLMProposal", "LLMReviewer", "LLMSpec", "LLMStepError", "LLMTransformer", "OpenAIChat", "Prices",
    "Prompts", "ReplayChat", "Reply", "Round", "Services", "Stall", "StepChoice", "TokenBudget", "ToolCall", "Trial",
    "Usage", "Workspace", "build_steps", "call", "check_files", "custom_steps", "feedback_text", "iterate",
    "load_custom", "local_build", "make_kit", "steps_from_config", "trial_record", "usage_record",
]
