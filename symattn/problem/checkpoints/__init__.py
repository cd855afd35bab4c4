"""Checkpoints: safetensors files read by symattn itself, and the model layouts they come in."""
