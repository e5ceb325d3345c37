"""InferenceSession (onnxruntime-shaped), SessionOptions."""

from .inference_session import InferenceSession, NodeArg
from .options import SessionOptions

__all__ = ["InferenceSession", "NodeArg", "SessionOptions"]
