"""Trainers align ships itself, where TRL has none (PPO with a critic), and the sampling they share.
Imports torch and transformers only: nothing of align's outside this package."""
