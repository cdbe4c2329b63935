"""Scaling ML Labs: the plumbing behind the notebooks, one module per concern.

Importing it (before TensorFlow) quiets TensorFlow once for the whole collection: its C++
start-up chatter (oneDNN, CPU features, dataset notes) and the INFO lines its Python logger
prints in a notebook ("Using MirroredStrategy ...", one per all-reduce) bury the lessons' own
output. Warnings and errors still show. Child processes inherit the C++ setting.
"""
import logging as _logging
import os as _os

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF sets its logger to INFO when it sees an interactive session; a filter outlasts that.
_logging.getLogger("tensorflow").addFilter(lambda record: record.levelno >= _logging.WARNING)
