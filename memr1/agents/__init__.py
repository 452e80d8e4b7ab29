"""The two agents as prompt builders and output parsers: pure text in, typed results out.

They hold no model; the pipeline sends their messages to a generation engine and their parsers read
the generations back.
"""

from memr1.agents.answer import ANSWER_FORMAT_ERRORS, AnswerAgent, AnswerParse
from memr1.agents.manager import MANAGER_FORMAT_ERRORS, ManagerAgent, temp_id_map

__all__ = [
    "ANSWER_FORMAT_ERRORS",
    "MANAGER_FORMAT_ERRORS",
    "AnswerAgent",
    "AnswerParse",
    "ManagerAgent",
    "temp_id_map",
]
