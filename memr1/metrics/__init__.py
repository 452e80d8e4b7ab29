"""Answer metrics of the Mem0 LoCoMo protocol (EM, token F1, BLEU-1) and their torchmetrics wrapper."""

from memr1.metrics.lexical import bleu1, bleu_tokens, exact_match, f1_tokens, normalize_answer, token_f1
from memr1.metrics.qa import QAMetrics

__all__ = ["QAMetrics", "bleu1", "bleu_tokens", "exact_match", "f1_tokens", "normalize_answer", "token_f1"]
