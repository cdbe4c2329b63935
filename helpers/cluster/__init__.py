"""Clusters of local OS processes running TensorFlow's distributed runtime.

The parameter-server engine of notebooks 05-07: `LocalCluster` (launcher.py) starts the
processes of node.py, which run ps.py, worker.py and evaluator.py by the rules of protocol.py
over the resources of wire.py. Notebook 08's clusters for TF's own strategies: tfconfig.py
starts the processes of strategies.py. helpers.system.netns keeps either off the network.
runlogs.py turns a run's event logs into tables and curves; psdemo.py is notebook 05's demo.
"""

from helpers.cluster.launcher import ClusterError, LocalCluster
from helpers.cluster.protocol import RunConfig, validate
from helpers.cluster.run import Run

__all__ = ["ClusterError", "LocalCluster", "Run", "RunConfig", "validate"]
