"""The serving engine: scheduler, paged KV blocks, runner, sampler and the engine thread.

Importing this package (and its re-exports below) never imports torch; the engine thread lives
in kiln.engine.loop, and the model runner is loaded when an AsyncEngine is built.
"""

from kiln.engine.config import EngineConfig
from kiln.engine.errors import EngineError
from kiln.engine.outputs import RequestMetrics, RequestOutput
from kiln.engine.request import Request, SamplingParams

__all__ = [
    "EngineConfig",
    "EngineError",
    "Request",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
]
