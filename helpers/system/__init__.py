"""The operating-system layer: child processes, the control lines they speak, their resources,
private networks.

Imports only the standard library, psutil and helpers' top-level config and files.
"""
