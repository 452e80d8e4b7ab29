"""`python evaluate.py [overrides]`, the paper's command shape: the app is `memr1.apps.evaluate` (`memr1 evaluate`)."""

from memr1.apps.evaluate import main

if __name__ == "__main__":
    main()
