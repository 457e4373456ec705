"""Placeholder until the task lands."""
