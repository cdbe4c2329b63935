"""The operating-system layer: child processes, their resources, private networks.

Imports only the standard library, psutil and helpers' top-level config and files.
"""
