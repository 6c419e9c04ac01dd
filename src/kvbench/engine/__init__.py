"""The pure, deterministic engine: continuous-batching scheduler, cost models, simulate().

No file I/O, no torch, no plotting: requests in, records out.
"""

from kvbench.engine.cost_model import CostModel, IterationShape
from kvbench.engine.profiled import ProfiledCostModel
from kvbench.engine.records import RequestRecord, SimulationResult, StepRecords
from kvbench.engine.roofline import PageMapping, RooflineCostModel
from kvbench.engine.scheduler import PREEMPTION_MODES, Scheduler, SchedulerLimits
from kvbench.engine.simulate import simulate

__all__ = [
    "PREEMPTION_MODES",
    "CostModel",
    "IterationShape",
    "PageMapping",
    "ProfiledCostModel",
    "RequestRecord",
    "RooflineCostModel",
    "Scheduler",
    "SchedulerLimits",
    "SimulationResult",
    "StepRecords",
    "simulate",
]
