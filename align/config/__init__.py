"""What a pipeline file may say, as types: one pydantic model per block and stage kind (`KINDS`), their
errors made readable, and what counts as a secret. Imports models, rewards and the top-level modules.
"""
