"""The data layer: verified downloads, MNIST, DBpedia-14 and the feature files of notebook 01.

May import helpers' top level (config, files) and helpers.system, never training or cluster.
"""
