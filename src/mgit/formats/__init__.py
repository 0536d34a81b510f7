"""Parsing what users hand to MGit: model folders, safetensors files, PyTorch checkpoints."""
