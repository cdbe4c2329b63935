"""A real TensorFlow parameter-server cluster of local processes: async, sync, SSP, backup."""
from helpers.cluster.launcher import ClusterError, LocalCluster, Run
from helpers.cluster.protocol import RunConfig, validate

__all__ = ["ClusterError", "LocalCluster", "Run", "RunConfig", "validate"]
