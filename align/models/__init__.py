"""Models: where they come from and how they load, the tiny one, their shapes and dtypes, and what their
states cost per rank by arithmetic. Imports only the top-level modules.
"""
