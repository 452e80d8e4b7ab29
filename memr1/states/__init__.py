"""RL states: what each agent sees in a step (`datasets`), the Manager's temporal bank (`windows`),
and the step-indexed, resumable order they are visited in (`order`)."""
