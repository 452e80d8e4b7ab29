"""Answer metrics of the Mem0 LoCoMo protocol and what memr1 adds to them.

- `lexical`: EM, token F1, BLEU-1 (Mem0's tokenisation), the RL reward's normalisation
- `qa`: `QAMetrics`, their torchmetrics wrapper (validation in training)
- `distill`: the selected memories' recall and precision of the question's evidence
- `judge`: the LLM-as-a-judge verdict

Submodules are imported directly (`from memr1.metrics.lexical import token_f1`): this package imports
nothing itself, so reading scores (`memr1 compare`, reports) never pays for importing torch.
"""
