"""The Hydra configs of `memr1 train` / `memr1 evaluate` (train.yaml, evaluate.yaml and their groups),
and the schedules of `memr1 pipeline` (pipeline/): a package so that Hydra finds them in an installed wheel."""
