"""Scaling ML Labs: the plumbing behind the notebooks, one module per concern."""
import os as _os

# TensorFlow's C++ start-up chatter (oneDNN, CPU features) buries the lessons' own output.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
