"""Public testing kit for prefzoo losses: Hypothesis strategies, reference formulas, property and conformance checks.

Importable with only torch, hypothesis and pytest installed, so plugin authors can
test their own losses with the same properties as the built-ins.
"""
