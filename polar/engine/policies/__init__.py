"""Policies decide what the reference engine's "model" says.

`base` defines the contract (PolicyRequest in, AssistantTurn out); `scripted`, `arithmetic`, `echo`, `tool_user` and
`plan` are the built-in policies; `registry` maps names to them and imports `module:Class` paths for outside ones.
"""

from polar.engine.policies.arithmetic import ArithmeticPolicy
from polar.engine.policies.base import AssistantTurn, Policy, PolicyRequest, SamplingParams
from polar.engine.policies.echo import EchoPolicy
from polar.engine.policies.plan import PlanPolicy
from polar.engine.policies.registry import POLICIES, PolicyFactory, load_policy
from polar.engine.policies.scripted import ScriptedPolicy
from polar.engine.policies.tool_user import ToolUserPolicy

__all__ = [
    "POLICIES",
    "ArithmeticPolicy",
    "AssistantTurn",
    "EchoPolicy",
    "PlanPolicy",
    "Policy",
    "PolicyFactory",
    "PolicyRequest",
    "SamplingParams",
    "ScriptedPolicy",
    "ToolUserPolicy",
    "load_policy",
]
