"""The pure core: parsing, prompts, scoring, statistics, reports as values.

Nothing in this package does file or network I/O or imports pytest, so every
rule here can be tested directly and reused outside the plugin.
"""
