"""The plan, the one place decisions are made: backend, placement of every model, precision, hardware and
memory per rank. Imports config, pipeline, backends, data and models; never stages or run.
"""
