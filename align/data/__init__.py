"""Datasets for stages: where rows come from (files, builtin corpora), every row checked before a model
loads, and how SFT batches them. Imports only the top-level modules.
"""
