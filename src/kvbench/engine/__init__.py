"""The pure, deterministic engine: continuous-batching scheduler, roofline cost model, simulate().

No file I/O, no torch, no plotting: requests in, records out.
"""

from kvbench.engine.cost_model import IterationShape, RooflineCostModel
from kvbench.engine.records import RequestRecord, SimulationResult, StepRecords
from kvbench.engine.scheduler import PREEMPTION_MODES, Scheduler, SchedulerLimits
from kvbench.engine.simulate import simulate

__all__ = [
    "PREEMPTION_MODES",
    "IterationShape",
    "RequestRecord",
    "RooflineCostModel",
    "Scheduler",
    "SchedulerLimits",
    "SimulationResult",
    "StepRecords",
    "simulate",
]
