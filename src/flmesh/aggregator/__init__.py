"""flmesh.aggregator."""
