# The dataflow stage: follows each LSE from the kernel call that produces it, through transposes,
# views, reassignments and base conversions, to each merge or DCP reduction that consumes it, and
# records scale arguments and LSE unpackings on the way - facts only; checks/lse.py and
# checks/scales.py turn them into findings.
from __future__ import annotations

from metax_audit.stages.dataflow.analysis import follow
from metax_audit.stages.dataflow.facts import (
    HT,
    TH,
    DataflowFacts,
    FlowEnd,
    FlowStep,
    LseFlow,
    ScaleArgument,
    ScaleCall,
    Unpacking,
)

__all__ = ["HT", "TH", "DataflowFacts", "FlowEnd", "FlowStep", "LseFlow", "ScaleArgument", "ScaleCall", "Unpacking",
           "follow"]
