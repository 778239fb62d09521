"""Measures of models that no trainer owns: held-out scores of preference and feedback data, and the
model-state bytes a rank really holds. Imports nothing of align's.
"""
