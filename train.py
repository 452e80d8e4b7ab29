"""`python train.py [overrides]`, the paper's command shape: the app is `memr1.apps.train` (`memr1 train`)."""

from memr1.apps.train import main

if __name__ == "__main__":
    main()
