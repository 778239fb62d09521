"""Trainers align ships itself, where TRL has none (PPO with a critic)."""
