"""Measures of models that no trainer owns: held-out scores of preference and feedback data, the
model-state bytes a rank really holds, and figures with their uncertainty (stats.py).
Imports nothing of align's.
"""
