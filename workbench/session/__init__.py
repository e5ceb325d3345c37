"""InferenceSession (onnxruntime-shaped), SessionOptions."""

from .inference_session import InferenceSession, NodeArg
from .io_binding import IOBinding
from .options import RunOptions, SessionOptions

__all__ = ["IOBinding", "InferenceSession", "NodeArg", "RunOptions", "SessionOptions"]
