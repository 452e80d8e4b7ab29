"""Reinforcement learning for the Memory Manager and the Answer Agent: the algorithms and their
settings (`memr1.rl.algorithms`, no torch: the preflight reads it), the tensor maths
(`memr1.rl.core`), rollout tensors and forwards (`memr1.rl.batch`) and the actor / critic update
(`memr1.rl.update`)."""
