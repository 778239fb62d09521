"""Reading a pipeline file into the config types and checking it whole: YAML, `--set`, paths, stage
references and their order, data files, `trl:` blocks. Imports config, backends, data, models.
"""
