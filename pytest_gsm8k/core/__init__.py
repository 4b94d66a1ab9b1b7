"""The pure core: parsing, prompts, scoring, statistics, reports as values. No file or network
I/O, no pytest (tests/repo/test_architecture.py), so every rule here is tested directly."""
