"""Differential fuzzing of the workbench executor against onnxruntime."""
