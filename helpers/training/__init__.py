"""The training layer: models, losses, optimizers, schedules, loops, Doc2Vec, MirroredStrategy.

May import helpers' top level, helpers.system and helpers.data, never helpers.cluster.
"""
