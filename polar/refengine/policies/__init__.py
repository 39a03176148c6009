"""Policies decide what the reference engine's "model" says.

`base` defines the contract (PolicyRequest in, AssistantTurn out, or ModelSamples: "let the model sample");
`scripted`, `arithmetic`, `echo`, `tool_user`, `plan` and `image_colour` are the built-in policies, `route` picks one
of them per conversation; `registry` maps names to them and imports `module:Class` paths for outside ones. A policy
drives the reference engine and real vLLM alike (`polar.refengine.vllm` holds vLLM to the policy's answer).
"""

from polar.refengine.policies.arithmetic import ArithmeticPolicy
from polar.refengine.policies.base import (
    AssistantTurn,
    ModelSamples,
    Policy,
    PolicyRequest,
    SamplingParams,
    SeenImage,
)
from polar.refengine.policies.echo import EchoPolicy
from polar.refengine.policies.image_colour import ImageColourPolicy
from polar.refengine.policies.plan import PlanPolicy
from polar.refengine.policies.registry import POLICIES, PolicyFactory, load_policy
from polar.refengine.policies.route import RoutePolicy
from polar.refengine.policies.scripted import ScriptedPolicy
from polar.refengine.policies.tool_user import ToolUserPolicy

__all__ = [
    "POLICIES",
    "ArithmeticPolicy",
    "AssistantTurn",
    "EchoPolicy",
    "ImageColourPolicy",
    "ModelSamples",
    "PlanPolicy",
    "Policy",
    "PolicyFactory",
    "PolicyRequest",
    "RoutePolicy",
    "SamplingParams",
    "ScriptedPolicy",
    "SeenImage",
    "ToolUserPolicy",
    "load_policy",
]
