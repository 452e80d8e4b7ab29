"""Lightning callbacks of the RL trainer."""

from memr1.callbacks.console import StepConsole
from memr1.callbacks.export import ExportPolicy
from memr1.callbacks.plots import TrainingCurves
from memr1.callbacks.checkpoints import AtomicCheckpointIO, checkpoint_step, latest_checkpoint
from memr1.callbacks.metrics_csv import MetricsCSV
from memr1.callbacks.resume import ResumableRun
from memr1.callbacks.samples import SampleLog
from memr1.callbacks.weight_sync import VLLMWeightSync

__all__ = [
    "AtomicCheckpointIO",
    "ExportPolicy",
    "MetricsCSV",
    "ResumableRun",
    "SampleLog",
    "StepConsole",
    "TrainingCurves",
    "VLLMWeightSync",
    "checkpoint_step",
    "latest_checkpoint",
]
