"""flmesh.cli."""
